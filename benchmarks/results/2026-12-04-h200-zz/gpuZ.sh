. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# run ZY's configuration (render-ahead 16, 500 ms lead, chunks of 4) with the 12 sessions started all at once, the
# server spreading each session's request phase (ServerConfig.spread_render_phases) off and on, interleaved
timeout 560 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 12,12,12 --render-aheads 16 --render-leads 0.5 --send-on-clock on --live-update-rows 10 --chunk-frames 4 --spread-render-phases off,on --warm-up-s 5 --json $OUT/load.json > $OUT/load.log 2>&1; echo rc=$?
grep -v "prebake" $OUT/load.log | grep "^\[\|ready after" | tail -14
python3 -c "
import json
for r in json.load(open('$OUT/load.json')):
    print({k: (round(r[k], 2) if isinstance(r.get(k), float) else r.get(k)) for k in ('sessions', 'spread_render_phases', 'sustained', 'fps_median', 'fps_min', 'server_fps', 'jitter_p95_ms', 'late_p95_ms', 'loop_lag_p95_ms', 'batch_frames_mean', 'requests_per_batch', 'skipped_frames_per_session', 'render_busy_share', 'session_render_call_ms', 'session_render_wait_ms')})
"
date -u
