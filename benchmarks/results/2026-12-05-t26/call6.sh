# 15 MuseTalk sessions, no render budget (does the H100 hold 450 frames/s live?), warm machine.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-420}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 15,15 \
  --json $OUT/load_musetalk15.json 2>&1 | grep -v Warn | tee $OUT/load_musetalk15.log | grep -v "^V1\|^\s" | tail -12
echo "done at $SECONDS s"
