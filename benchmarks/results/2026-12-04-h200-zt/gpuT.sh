. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# MuseTalk 30 fps (run ZM's settings): the side-stream compose against the session's stream with the order reversed
# (stream first in each pair; runs ZR and ZS had session first), 12 and 10 sessions, one fresh server, no profiler
timeout 500 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 12,12,10 --render-aheads 8 --render-leads 0.25 --send-on-clock on --live-update-rows 10 --compose stream,session --warm-up-s 5 --json $OUT/load.json > $OUT/load.log 2>&1; echo rc=$?
grep -v "prebake" $OUT/load.log | grep "^\[" | tail -13
python3 -c "
import json
for r in json.load(open('$OUT/load.json')):
    print({k: (round(r[k], 2) if isinstance(r.get(k), float) else r.get(k)) for k in ('sessions', 'compose', 'sustained', 'fps_median', 'server_fps', 'jitter_p95_ms', 'loop_lag_p95_ms', 'batch_frames_mean', 'skipped_frames_per_session', 'render_busy_share', 'render_wait_ms_mean', 'session_render_call_ms', 'session_render_wait_ms', 'session_copy_out_ms', 'gpu_peak_mb')})
"
date -u
