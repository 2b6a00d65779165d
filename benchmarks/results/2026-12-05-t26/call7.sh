# 16 MuseTalk sessions with render ahead 24 frames (larger batches than 16), warm machine.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-420}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 24 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16 \
  --json $OUT/load_musetalk16_ra24.json 2>&1 | grep -v Warn | tee $OUT/load_musetalk16_ra24.log | grep -v "^V1\|^\s" | tail -12
echo "done at $SECONDS s"
