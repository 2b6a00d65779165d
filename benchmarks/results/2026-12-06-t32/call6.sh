# Thirty-second session, call 6: the capture-stream tests, then 16 live MuseTalk sessions with compose graphs on and
# batch graphs off (the level that failed in call 1 and segfaulted in garbage collection in call 5).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
# (skipped for device time) timeout 60 python -m pytest -q tests/test_accel.py -k "capture_stream or capture_mid_stream or graph_family or two_streams" -p no:cacheprovider 2>&1 | tail -2
timeout -s ABRT 170 python -X faulthandler -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 \
  --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 3 --duration 12 --sessions 16 --fill-render-batches on \
  --render-in-flight 2 --batch-graphs off --compose-graphs on \
  --json $OUT/load_compose_graphs.json > $OUT/load_compose_graphs.log 2>&1; echo "rc $?"
grep -v Warn $OUT/load_compose_graphs.log | grep "^\[\|Error\|error\|Fatal" | grep -v starts | tail -8
python - $OUT/load_compose_graphs.json <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])):
    print("batch graphs", r["batch_graphs"], "compose graphs", r["compose_graphs"], "sustained", r["sustained"],
          "fps", r["server_fps"], "min", round(r["fps_min"], 1), "busy", round(r["render_busy_share"], 2),
          "GIL p50/p95", r.get("gil_wait_p50_ms"), r.get("gil_wait_p95_ms"),
          "render call/wait/copy-out", round(r["session_render_call_ms"], 1), round(r["session_render_wait_ms"], 1),
          round(r["session_copy_out_ms"], 1))
PY
