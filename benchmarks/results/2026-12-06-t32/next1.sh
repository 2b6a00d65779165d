# For the next GPU session's first call (cold; ~450 s of wall time): (1) the host, described (the thirty-first and
# thirty-second sessions' H100s differed ~4x in how fast the server's Python threads ran); (2) the capture-stream tests
# (accel/own_stream.py) and the graph paths' byte checks (batch graphs; compose graphs with the faces' layout kept);
# (3) 16 live MuseTalk sessions with compose graphs on, batch graphs off and on -- the level that failed (call 1) and
# never ran after the fix (calls 5-6: a segfault with destroyed streams, then a cold compile past the time limit).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
grep -m1 "model name" /proc/cpuinfo; nproc; grep -m3 "MHz" /proc/cpuinfo | tr '\n' ' '; echo; cat /proc/loadavg
timeout 120 python -m pytest -q tests/test_accel.py tests/test_batching.py -k "capture or graph_family or two_streams or pooled or own_stream or switched" -p no:cacheprovider 2>&1 | tail -3
timeout 150 python -m benchmarks.batch_dispatch --accel cudagraph --busy-threads 16 --batches 20 \
  --json $OUT/batch_dispatch.json 2>&1 | grep -v Warn | grep "bytes\|DIFF\|busy" | tail -14
echo "checks done at $SECONDS s"
timeout -s ABRT ${L:-420} python -X faulthandler -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16 --fill-render-batches on \
  --render-in-flight 2 --batch-graphs off,on --compose-graphs on,off \
  --json $OUT/load_compose_graphs.json > $OUT/load_compose_graphs.log 2>&1; echo "rc $?"
grep -v Warn $OUT/load_compose_graphs.log | grep "^\[\|Fatal\|Error" | grep -v starts | tail -8
python - $OUT/load_compose_graphs.json <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])):
    print("batch graphs", r["batch_graphs"], "compose graphs", r["compose_graphs"], "sustained", r["sustained"],
          "errors", r["errors"], "fps", r["server_fps"], "min", round(r["fps_min"], 1), "busy", round(r["render_busy_share"], 2),
          "GIL p50/p95", r.get("gil_wait_p50_ms"), r.get("gil_wait_p95_ms"),
          "render call/wait/copy-out", round(r["session_render_call_ms"], 1), round(r["session_render_wait_ms"], 1),
          round(r["session_copy_out_ms"], 1))
PY
echo "done at $SECONDS s"
