. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# 14 sessions for 30 s each, raw NV12 only, server phase spreading on (run ZZ5's first NV12 level was late: once, or a pattern?)
timeout 560 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 30 --accel compile+cudagraph --client-processes 4 --sessions 14,14,14 --format nv12 --render-aheads 16 --render-leads 0.5 --send-on-clock on --live-update-rows 10 --chunk-frames 4 --spread-render-phases on --warm-up-s 5 --json $OUT/load14c.json > $OUT/load14c.log 2>&1; echo rc=$?
grep -v "prebake" $OUT/load14c.log | grep "^\[\|ready after" | tail -14
python3 -c "
import json
for r in json.load(open('$OUT/load14c.json')):
    print({k: (round(r[k], 2) if isinstance(r.get(k), float) else r.get(k)) for k in ('sessions', 'format', 'spread_render_phases', 'sustained', 'fps_median', 'fps_min', 'server_fps', 'jitter_p95_ms', 'late_p95_ms', 'loop_lag_p95_ms', 'batch_frames_mean', 'requests_per_batch', 'skipped_frames_per_session', 'render_busy_share', 'session_render_call_ms', 'session_render_wait_ms')})
"
date -u
