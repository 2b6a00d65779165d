# Thirty-second session, call 4 (cold): (1) the capture-stream fix (accel/own_stream.py) on the GPU: its tests, and the
# reproduction run once with the old pooled side stream (expected to fail) and once as it is now; (2) why the compose
# graphs differed by 1 for 16-frame requests (compose_diff.py); (3) 16 live MuseTalk sessions with compose graphs on
# (the level that failed in call 1), batch graphs on and off, two render batches in flight.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 120 python -m pytest -q -x tests/test_accel.py -k "capture_stream or capture_mid_stream or graph_family or graph_runner or two_streams" -p no:cacheprovider 2>&1 | tail -4
timeout 90 python - <<'PY' 2>&1 | tail -4
import torch, newsstudio.accel.graph_capture as gc
from tests.test_accel import test_capture_mid_stream_survives_other_threads_waiting_on_pooled_streams as t
gc.thread_capture_stream = lambda d: torch.cuda.Stream(d)  # the old side stream, from the pool
try:
    t(); print("old pooled side stream: test PASSED (did not reproduce)")
except BaseException as e:
    print("old pooled side stream: test FAILED as expected:", type(e).__name__, str(e)[:300])
PY
echo "tests done at $SECONDS s"
timeout 150 python benchmarks/results/2026-12-06-t32/compose_diff.py 2>&1 | grep -v Warn | tail -40
echo "diff done at $SECONDS s"
timeout 200 python -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 \
  --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16 --fill-render-batches on \
  --render-in-flight 2 --batch-graphs off,on --compose-graphs on \
  --json $OUT/load_compose_graphs.json 2>&1 | grep -v Warn | tee $OUT/load_compose_graphs.log | grep "^\[" | grep -v starts | tail -6
python - $OUT/load_compose_graphs.json <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])):
    print("batch graphs", r["batch_graphs"], "compose graphs", r["compose_graphs"], "sustained", r["sustained"],
          "fps", r["server_fps"], "min", round(r["fps_min"], 1), "batch", round(r["batch_frames_mean"], 1),
          "busy", round(r["render_busy_share"], 2), "GIL p50/p95", r.get("gil_wait_p50_ms"), r.get("gil_wait_p95_ms"),
          "render call/wait/copy-out", round(r["session_render_call_ms"], 1), round(r["session_render_wait_ms"], 1),
          round(r["session_copy_out_ms"], 1))
PY
grep -c "Traceback" $OUT/load_compose_graphs.log
echo "done at $SECONDS s"
