# For the next session's first device call (~300 s on a cold machine): 16 MuseTalk live sessions at 30 fps with the
# render batches as queued and filled to their buckets (ServerConfig.fill_render_batches), alternating, two levels
# each; the settings of this session's runs 16a/16b (433-441 frames/s as queued, batches of 25-29 frames run as 32).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-420}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16,16 --fill-render-batches off,on \
  --json $OUT/load_musetalk16_fill.json 2>&1 | grep -v Warn | tee $OUT/load_musetalk16_fill.log | grep -v "^V1\|^\s" | tail -14
echo "recompiles: $(grep -c 'Recompiling function' $OUT/load_musetalk16_fill.log)"
echo "done at $SECONDS s"
