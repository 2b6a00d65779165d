. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# 1: Ditto segment -> MP4, every bucket warmed first: fixed 32-frame chunks vs ramped 8 -> 32 -> 8 (~8), two x264 configs
timeout 170 python3 -m benchmarks.ditto_bench --size 1080x1920 --skip-reference --variants compile+cudagraph --repeat 3 --chunk 32 --mp4 ultrafast:12/8/1,ultrafast:12/8/1~8,ultrafast:8/4/2,ultrafast:8/4/2~8 --json $OUT/ditto_ramp3.json > $OUT/ditto_ramp3.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/ditto_ramp3.log | grep -i "mp4\|dense fps\|first frame\|load" | tail -7
python3 -c "import json; d=json.load(open('$OUT/ditto_ramp3.json')); v=d['ditto']['ours'] if 'ditto' in d else d['ours']; print('warm_up_s', v.get('warm_up_s'))" 2>&1 | tail -1
date -u
# 2: MuseTalk at 30 fps, 12 sessions on a fresh server, twice (lead 250 ms, Whisper update every 200 ms, render ahead 8)
timeout 235 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 12,12 --render-aheads 8 --render-leads 0.25 --send-on-clock on --live-update-rows 10 --warm-up-s 5 --json $OUT/load_12.json > $OUT/load_12.log 2>&1; echo rc=$?
grep -v "prebake" $OUT/load_12.log | grep "^\[" | tail -5
python3 -c "
import json
for r in json.load(open('$OUT/load_12.json')):
    print({k: (round(r[k], 2) if isinstance(r.get(k), float) else r.get(k)) for k in ('sessions', 'sustained', 'fps_median', 'fps_min', 'server_fps', 'jitter_p95_ms', 'late_p95_ms', 'batch_frames_mean', 'requests_per_batch', 'request_frames_mean', 'skipped_frames_per_session', 'render_busy_share', 'session_render_call_ms', 'session_copy_out_ms', 'gpu_peak_mb')})
"
date -u
