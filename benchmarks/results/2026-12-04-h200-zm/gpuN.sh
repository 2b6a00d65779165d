. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# 1: the skip test and the fused compose test on a GPU
NEWSSTUDIO_MEDIA_DIR=.carry/media timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_batching.py tests/test_server.py -k "composing or finish or skips_to" 2>&1 | tail -6
date -u
# 2: MuseTalk at 30 fps, 10 and 12 sessions, lead 250 ms, Whisper update every 200 ms, with the skip fix (8633306): compose in batch off vs on
timeout 420 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 10,12 --render-aheads 8 --render-leads 0.25 --send-on-clock on --compose-in-batch off,on --live-update-rows 10 --warm-up-s 5 --json $OUT/load_skip.json > $OUT/load_skip.log 2>&1; echo rc=$?
grep -v "prebake" $OUT/load_skip.log | grep "^\[" | tail -10
python3 -c "
import json
for r in json.load(open('$OUT/load_skip.json')):
    print({k: (round(r[k], 2) if isinstance(r.get(k), float) else r.get(k)) for k in ('sessions', 'compose_in_batch', 'live_update_rows', 'sustained', 'fps_median', 'server_fps', 'jitter_p95_ms', 'late_p95_ms', 'batch_frames_mean', 'requests_per_batch', 'request_frames_mean', 'short_render_share', 'driving_ahead_frames', 'underrun_ms_per_session', 'skipped_frames_per_session', 'render_busy_share', 'session_render_call_ms', 'session_copy_out_ms')})
"
date -u
