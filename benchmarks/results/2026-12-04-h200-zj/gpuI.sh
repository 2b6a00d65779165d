. .carry/setup.sh
set -o pipefail
date -u
# MuseTalk at 30 fps, render ahead 8: is 10-12 sessions latency-bound (render call ~150 ms vs a 150 ms lead)? leads 250/350 ms x phase slots off/3, render window 10 ms
timeout 540 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 10,12 --render-aheads 8 --render-leads 0.25,0.35 --send-on-clock on --phase-slots 0,3 --render-windows-ms 10 --warm-up-s 5 --json $OUT/load_musetalk30r.json > $OUT/load_musetalk30r.log 2>&1; echo rc=$?
grep -v "prebake" $OUT/load_musetalk30r.log | grep "^\[" | tail -12
python3 -c "
import json
for r in json.load(open('$OUT/load_musetalk30r.json')):
    print({k: (round(r[k], 2) if isinstance(r.get(k), float) else r.get(k)) for k in ('sessions', 'render_lead_ms', 'phase_slots', 'sustained', 'fps_median', 'server_fps', 'jitter_p95_ms', 'late_p95_ms', 'batch_frames_mean', 'requests_per_batch', 'request_frames_mean', 'render_wait_ms_mean', 'render_busy_share', 'session_render_call_ms', 'session_copy_out_ms')})
"
date -u
