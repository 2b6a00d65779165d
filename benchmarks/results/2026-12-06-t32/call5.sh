# Thirty-second session, call 5: why the capture reproduction failed with own streams too (full output), compose
# graphs' bytes with the faces' own layout, and the live level with compose graphs that did not start in call 4
# (timed out silently at 200 s: a hang or a slow start?), with tracebacks of every thread on timeout.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 90 python -m pytest -q -x tests/test_accel.py -k "capture_mid_stream" -p no:cacheprovider 2>&1 | grep -v "^  warn\|Warn" | tail -25
timeout 100 python benchmarks/results/2026-12-06-t32/compose_diff.py 2>&1 | grep "graph vs direct:" | sort | uniq -c
echo "at $SECONDS s"
timeout -s ABRT 280 python -X faulthandler -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 \
  --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16 --fill-render-batches on \
  --render-in-flight 2 --batch-graphs off --compose-graphs on \
  --json $OUT/load_compose_graphs.json > $OUT/load_compose_graphs.log 2>&1; echo "rc $?"
grep -v Warn $OUT/load_compose_graphs.log | grep "^\[\|Error\|error" | grep -v starts | tail -8
grep -v Warn $OUT/load_compose_graphs.log | grep -B2 -A12 "most recent call first" | head -80
echo "done at $SECONDS s"
