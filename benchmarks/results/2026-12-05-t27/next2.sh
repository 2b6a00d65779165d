# For the next GPU session, after next1.sh if the lower-face decoder paid there (~330 s cold): 16 MuseTalk live
# sessions at 30 fps, decoding face rows 104-255 only (serve --first-face-row 104), render batches as queued and
# filled to their buckets (alternating), two levels each; the settings of the twenty-sixth session's runs (433-441
# frames/s with the whole face). The load test's astronaut avatar blends face rows from 119 on (CPU, this session).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-450}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16,16 --fill-render-batches off,on \
  --first-face-row 104 --json $OUT/load_musetalk16_rows104.json 2>&1 | grep -v Warn | tee $OUT/load_musetalk16_rows104.log \
  | grep -v "^V1\|^\s" | tail -14
echo "recompiles: $(grep -c 'Recompiling function' $OUT/load_musetalk16_rows104.log)"
echo "done at $SECONDS s"
