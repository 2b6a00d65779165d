. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# MuseTalk 30 fps, render-ahead 16 (run ZV: 11 of 12 on time in one of two levels; render-ahead 8: 0 of 12 in four):
# a 250 ms vs a 500 ms render lead (with 16 frames per request a session's one chain may take up to 533 ms), 12 and 14
# sessions, raw NV12; one fresh server, no profiler
timeout 540 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 12,14,12 --render-aheads 16 --render-leads 0.25,0.5 --send-on-clock on --live-update-rows 10 --warm-up-s 5 --json $OUT/load.json > $OUT/load.log 2>&1; echo rc=$?
grep -v "prebake" $OUT/load.log | grep "^\[" | tail -13
python3 -c "
import json
for r in json.load(open('$OUT/load.json')):
    print({k: (round(r[k], 2) if isinstance(r.get(k), float) else r.get(k)) for k in ('sessions', 'render_ahead', 'render_lead_ms', 'format', 'sustained', 'fps_median', 'fps_min', 'server_fps', 'jitter_p95_ms', 'late_p95_ms', 'loop_lag_p95_ms', 'batch_frames_mean', 'requests_per_batch', 'skipped_frames_per_session', 'render_busy_share', 'render_wait_ms_mean', 'session_render_call_ms', 'session_render_wait_ms', 'session_copy_out_ms', 'short_render_share', 'driving_ahead_frames', 'gpu_peak_mb')})
"
date -u
