# 16 and 20 live MuseTalk sessions at the default MuseTalk feature step (100 ms = 5 rows of 20 ms), both graph
# families on vs both off (call 1 measured the 200 ms step: 16 of 16 in all four combinations).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout -s ABRT ${L:-540} python -X faulthandler -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 5 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16,20 --fill-render-batches on \
  --render-in-flight 2 --batch-graphs on,off --compose-graphs on \
  --json $OUT/load_step100.json > $OUT/load_step100.log 2>&1; echo "rc $?"
grep -v Warn $OUT/load_step100.log | grep "^\[\|Fatal\|Error" | grep -v starts | tail -8
python - $OUT/load_step100.json <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["sessions"], "batch graphs", r["batch_graphs"], "compose graphs", r["compose_graphs"], "sustained", r["sustained"],
          "errors", r["errors"], "fps", r["server_fps"], "min", round(r["fps_min"], 1), "busy", round(r["render_busy_share"], 2),
          "GIL p50/p95", r.get("gil_wait_p50_ms"), r.get("gil_wait_p95_ms"),
          "render call/wait/copy-out", round(r["session_render_call_ms"], 1), round(r["session_render_wait_ms"], 1),
          round(r["session_copy_out_ms"], 1))
PY
echo "done at $SECONDS s"
