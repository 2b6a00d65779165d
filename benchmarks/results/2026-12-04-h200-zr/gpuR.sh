. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# 1: the compose modes on a GPU: frames equal to the plain path's, byte for byte, in each mode
NEWSSTUDIO_MEDIA_DIR=.carry/media timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_batching.py -k "composing_through or compose_mode or own_stream" 2>&1 | tail -6
date -u
# 2: MuseTalk at 30 fps (run ZM's settings), compose on the session's stream vs a side stream, alternating levels on one
#    fresh server; per-thread CPU from /proc and GPU utilisation from nvidia-smi alongside
nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,power.draw --format=csv,noheader -lms 250 > $OUT/smi.csv 2>&1 &
SMI=$!
(timeout 470 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 12,12,14 --render-aheads 8 --render-leads 0.25 --send-on-clock on --live-update-rows 10 --compose session,stream --warm-up-s 5 --json $OUT/load.json > $OUT/load.log 2>&1; echo rc=$? >> $OUT/load.log) &
LT=$!
sleep 10
PID=$(pgrep -o -f "^python3 -m benchmarks.load_test")
python3 -m benchmarks.thread_cpu $PID --seconds 480 --out $OUT/cpu.jsonl &
wait $LT
kill $SMI
grep -v "prebake" $OUT/load.log | grep "^\[\|rc=" | tail -14
python3 -c "
import json
for r in json.load(open('$OUT/load.json')):
    print({k: (round(r[k], 2) if isinstance(r.get(k), float) else r.get(k)) for k in ('sessions', 'compose', 'sustained', 'fps_median', 'server_fps', 'jitter_p95_ms', 'loop_lag_p95_ms', 'batch_frames_mean', 'requests_per_batch', 'skipped_frames_per_session', 'render_busy_share', 'audio_busy_share', 'render_wait_ms_mean', 'session_render_call_ms', 'session_render_wait_ms', 'session_copy_out_ms', 'gpu_peak_mb')})
"
python3 - <<PY
import csv, datetime, json
rows = [r for r in csv.reader(open('$OUT/smi.csv')) if len(r) >= 4]
ts = lambda s: datetime.datetime.strptime(s.strip(), '%Y/%m/%d %H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc).timestamp()
cpu = [json.loads(l) for l in open('$OUT/cpu.jsonl')]
# 20 s levels: print GPU utilisation and the process's CPU per 10 s bucket
t0 = ts(rows[0][0]) if rows else 0
b = {}
for r in rows:
    k = int((ts(r[0]) - t0) // 10); b.setdefault(k, []).append(float(r[1].split()[0]))
c = {}
for r in cpu:
    k = int((r['t'] - t0) // 10); c.setdefault(k, []).append(r['process'])
print('10 s buckets from', datetime.datetime.utcfromtimestamp(t0).time(), ': GPU util % / process cores')
print(' '.join(f"{k*10}:{sum(v)/len(v):.0f}/{sum(c.get(k,[0]))/max(1,len(c.get(k,[0]))):.1f}" for k, v in sorted(b.items())))
PY
cd $OUT && tar czf zr.tgz load.json load.log cpu.jsonl smi.csv && rm -f cpu.jsonl smi.csv
date -u
