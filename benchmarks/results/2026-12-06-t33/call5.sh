# call 5 (warm, same host as call 4): 16 MuseTalk sessions, batch graphs off then on (compose graphs on by default).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
summary() { python - "$1" <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["sessions"], "batch graphs", r["batch_graphs"], "compose graphs", r["compose_graphs"], "sustained", r["sustained"],
          "errors", r["errors"], "fps", r["server_fps"], "min", round(r["fps_min"], 1), "jitter p95", r.get("jitter_p95_ms"),
          "busy", round(r["render_busy_share"], 2), "GIL p50/p95", r.get("gil_wait_p50_ms"), r.get("gil_wait_p95_ms"),
          "render call/wait/copy-out", round(r["session_render_call_ms"], 1), round(r["session_render_wait_ms"], 1),
          round(r["session_copy_out_ms"], 1))
PY
}
timeout -s ABRT ${LB:-300} python -X faulthandler -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16 --batch-graphs off,on --fill-render-batches on \
  --json $OUT/load_defaults_ab.json > $OUT/load_defaults_ab.log 2>&1; echo "rc $?"
grep -v Warn $OUT/load_defaults_ab.log | grep "^\[\|Fatal\|Error" | grep -v starts | tail -5; summary $OUT/load_defaults_ab.json
echo "done at $SECONDS s"
