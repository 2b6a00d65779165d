. .carry/setup.sh
set -o pipefail
date -u
# MuseTalk at 30 fps, 12 sessions: requests were 5.8-7.2 of 8 frames (speech features not ready: the prebuffer of 267 ms left ~33 ms of slack). Prebuffer 400 ms, lead 250 ms, phase slots off vs 3
timeout 268 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 12 --render-aheads 8 --render-leads 0.25 --prebuffer-ms 400 --send-on-clock on --phase-slots 0,3 --render-windows-ms 10 --warm-up-s 3 --json $OUT/load_musetalk30s.json > $OUT/load_musetalk30s.log 2>&1; echo rc=$?
grep -v "prebake" $OUT/load_musetalk30s.log | grep "^\[" | tail -6
python3 -c "
import json
for r in json.load(open('$OUT/load_musetalk30s.json')):
    print({k: (round(r[k], 2) if isinstance(r.get(k), float) else r.get(k)) for k in ('sessions', 'render_lead_ms', 'prebuffer_ms', 'phase_slots', 'sustained', 'fps_median', 'server_fps', 'jitter_p95_ms', 'late_p95_ms', 'batch_frames_mean', 'requests_per_batch', 'request_frames_mean', 'render_wait_ms_mean', 'render_busy_share', 'session_render_call_ms', 'session_copy_out_ms')})
"
date -u
