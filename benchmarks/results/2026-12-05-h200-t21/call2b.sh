# The MuseTalk UNet with its GroupNorm statistics by the NHWC kernel, against the same network
# compiled + graphed without it (batch 32, as the engine's dense runs); then, in the time left, the
# MuseTalk engine with the NHWC norms (':gn') against its default, reference skipped.
# (Twenty-second session; not yet run.)
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 90 python -m benchmarks.rewrite_check --batch 8 2>&1 | grep -v Warn | tee $OUT/rewrite_check.log  # incl. the NHWC norms on CUDA
r="fp16 channels_last compile+cudagraph"
python -m benchmarks.levers --only unet --batch unet=32 --budget 250 --json $OUT/levers_unet2.json \
  --levers "$r;$r, nhwc group norms" 2>&1 | tee $OUT/levers_unet2.log | grep "\[unet\]"
timeout $((585 - SECONDS)) python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference \
  --variants compile+cudagraph,compile+cudagraph:gn --json $OUT/musetalk_gn.json 2>&1 | grep -v Warn | tee $OUT/musetalk_gn.log | grep "\[musetalk\] ours\|^|" | tail -20
echo "done at $SECONDS s"
