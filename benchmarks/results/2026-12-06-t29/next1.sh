# For the next GPU session's first call (~420 s cold; L=420): 16 MuseTalk live sessions at 30 fps with the new default
# (the lower-face decoder, rows 104-255: render stage 651 instead of 530 frames/s at batch 32 on an H100, twenty-ninth
# session), render batches as queued and filled to their buckets (alternating), two levels each; otherwise the twenty-
# sixth session's settings (16 sessions then: 0 of 16 on time at 433-441 frames/s with the whole face). The load test's
# astronaut avatar blends face rows from 119 on, so 'auto' uses the lower decoder for it.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-420}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16,16 --fill-render-batches off,on \
  --json $OUT/load_musetalk16_auto.json 2>&1 | grep -v Warn | tee $OUT/load_musetalk16_auto.log | grep -v "^V1\|^\s" | tail -14
echo "recompiles: $(grep -c 'Recompiling function' $OUT/load_musetalk16_auto.log)"
echo "done at $SECONDS s"
