. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# MuseTalk 30 fps, 12 sessions, render-ahead 16, 500 ms render lead (run ZW: 12 of 12 in one level of two): three
# levels each with the clients' chunks of 2 frames (A) and of 4 frames (B: half the chunk messages and executor calls
# per second on the server's event loop and threads); two servers, one after the other (B reuses A's compile cache)
for chunk in 2 4; do
  s=$([ $chunk = 2 ] && echo 300 || echo 220)
  timeout $s python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 12,12,12 --render-aheads 16 --render-leads 0.5 --send-on-clock on --live-update-rows 10 --chunk-frames $chunk --warm-up-s 5 --json $OUT/load_chunk$chunk.json > $OUT/load_chunk$chunk.log 2>&1; echo chunk $chunk rc=$?
  grep -v "prebake" $OUT/load_chunk$chunk.log | grep "^\[\|ready after" | tail -8
  python3 -c "
import json
for r in json.load(open('$OUT/load_chunk$chunk.json')):
    print({k: (round(r[k], 2) if isinstance(r.get(k), float) else r.get(k)) for k in ('sessions', 'render_ahead', 'render_lead_ms', 'sustained', 'fps_median', 'fps_min', 'server_fps', 'jitter_p95_ms', 'late_p95_ms', 'loop_lag_p95_ms', 'batch_frames_mean', 'requests_per_batch', 'skipped_frames_per_session', 'render_busy_share', 'session_render_call_ms', 'session_render_wait_ms', 'session_copy_out_ms', 'driving_ahead_frames')})
"
done
date -u
