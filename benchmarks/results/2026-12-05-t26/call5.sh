# 16 MuseTalk sessions against a server whose render budget is 420 frames/s (14 x 30): 14 admitted and on
# time, 2 refused (WebSocket 1013) instead of all 16 late; then 14 under the same budget. Warm machine.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-420}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16,14 --max-render-fps musetalk=420 \
  --json $OUT/load_musetalk_budget.json 2>&1 | grep -v Warn | tee $OUT/load_musetalk_budget.log | grep -v "^V1\|^\s" | tail -12
echo "done at $SECONDS s"
