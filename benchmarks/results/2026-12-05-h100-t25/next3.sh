# For the next session (not yet run; the twenty-fourth session's call3.sh, ~450 s, on an H200): 16 MuseTalk live streams at 30 fps with the engine's new defaults (the decoder's NHWC
# norms on; their pixel splits no longer depend on the batch, so no recompiles per batch size), the eighteenth
# session's settings (ZZ3), two 20 s levels; Dynamo's recompile log on (the server's time to ready shows the warm-up).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-430}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16,16 --json $OUT/load_musetalk16.json \
  2>&1 | grep -v Warn | tee $OUT/load_musetalk16.log | grep -v "^V1\|^\s" | tail -30
echo "recompiles: $(grep -c 'Recompiling function' $OUT/load_musetalk16.log)"
echo "done at $SECONDS s"
