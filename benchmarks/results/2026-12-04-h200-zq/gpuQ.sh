. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# MuseTalk 12 sessions at 30 fps (run ZM's settings), four levels on a fresh server, with the server's threads
# watched: py-spy (nonblocking, 100 Hz: GIL holder / on-CPU / all threads) 6-12 s into each level, per-thread CPU
# from /proc every second, GPU utilisation from nvidia-smi every 250 ms.
nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 250 > $OUT/smi.csv 2>&1 &
SMI=$!
(timeout 420 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 12,12,12,12 --render-aheads 8 --render-leads 0.25 --send-on-clock on --live-update-rows 10 --warm-up-s 5 --json $OUT/load.json > $OUT/load.log 2>&1; echo rc=$? >> $OUT/load.log) &
LT=$!
sleep 10
PID=$(pgrep -o -f "^python3 -m benchmarks.load_test")
echo "server pid $PID"
python3 -m benchmarks.thread_cpu $PID --seconds 430 --out $OUT/cpu.jsonl &
for n in 1 2 3 4; do
  for i in $(seq 1 400); do [ "$(grep -c 'level of 12 sessions starts' $OUT/load.log 2>/dev/null)" -ge $n ] && break; kill -0 $LT 2>/dev/null || break; sleep 1; done
  kill -0 $LT 2>/dev/null || break
  sleep 6
  t0=$(date +%s.%N)
  py-spy record --pid $PID --nonblocking --threads -r 100 -d 6 -f raw -o $OUT/active_$n.txt > /dev/null 2>&1 & A=$!
  py-spy record --pid $PID --nonblocking --threads --gil -r 100 -d 6 -f raw -o $OUT/gil_$n.txt > /dev/null 2>&1 & G=$!
  py-spy record --pid $PID --nonblocking --threads --idle -r 100 -d 6 -f raw -o $OUT/idle_$n.txt > /dev/null 2>&1 & I=$!
  wait $A $G $I
  t1=$(date +%s.%N)
  echo "$n $t0 $t1" >> $OUT/windows.txt
  timeout 20 py-spy dump --pid $PID > $OUT/dump_$n.txt 2>&1
done
wait $LT
kill $SMI
grep -v "prebake" $OUT/load.log | grep "^\[\|rc=" | tail -10
python3 -c "
import json
for r in json.load(open('$OUT/load.json')):
    print({k: (round(r[k], 2) if isinstance(r.get(k), float) else r.get(k)) for k in ('sessions', 'sustained', 'fps_median', 'server_fps', 'jitter_p95_ms', 'loop_lag_p95_ms', 'batch_frames_mean', 'requests_per_batch', 'skipped_frames_per_session', 'render_busy_share', 'audio_busy_share', 'session_render_call_ms', 'session_copy_out_ms')})
"
while read n t0 t1; do
  echo "=== level $n ($t0 - $t1)"
  python3 -m benchmarks.thread_cpu --summary $OUT/cpu.jsonl --names $OUT/dump_$n.txt --window $t0,$t1 | tr -d '\n ' | head -c 700; echo
  python3 -c "
import csv, datetime
rows = [r for r in csv.reader(open('$OUT/smi.csv')) if len(r) >= 5]
def ts(s): return datetime.datetime.strptime(s.strip(), '%Y/%m/%d %H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc).timestamp()
sel = [r for r in rows if $t0 <= ts(r[0]) <= $t1]
u = [float(r[1].split()[0]) for r in sel]; c = [float(r[2].split()[0]) for r in sel]; p = [float(r[3].split()[0]) for r in sel]
print('smi util mean %.1f min %.0f max %.0f; sm clock %.0f-%.0f MHz; power %.0f W' % (sum(u)/len(u), min(u), max(u), min(c), max(c), sum(p)/len(p)) if sel else 'smi: no rows')
" 2>&1 | tail -1
  python3 -m benchmarks.pyspy_summary $OUT/gil_$n.txt $OUT/active_$n.txt --seconds 6 --threads render-batcher --depth 2 2>&1 | head -40
done < $OUT/windows.txt
date -u
