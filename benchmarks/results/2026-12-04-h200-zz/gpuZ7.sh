. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# Ditto at 30 fps, 8 sessions (run ZE's render-ahead 8, 150 ms lead, sent on the clock): does the server's phase
# spreading (now on by default, measured on MuseTalk) change Ditto? off and on on one server
timeout 215 python3 -m benchmarks.load_test --engine ditto --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 8 --render-aheads 8 --render-leads 0.15 --send-on-clock on --spread-render-phases off,on --warm-up-s 5 --json $OUT/load_ditto.json > $OUT/load_ditto.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using\|prebake" $OUT/load_ditto.log | grep "^\[\|ready after" | cut -c1-330 | tail -8
python3 -c "
import json
for r in json.load(open('$OUT/load_ditto.json')):
    print({k: (round(r[k], 2) if isinstance(r.get(k), float) else r.get(k)) for k in ('sessions', 'spread_render_phases', 'sustained', 'fps_median', 'fps_min', 'server_fps', 'jitter_p95_ms', 'late_p95_ms', 'loop_lag_p95_ms', 'batch_frames_mean', 'requests_per_batch', 'skipped_frames_per_session', 'render_busy_share', 'session_render_call_ms', 'session_render_wait_ms', 'gpu_peak_mb')})
"
date -u
