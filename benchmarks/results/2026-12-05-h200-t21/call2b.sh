# The MuseTalk UNet with its GroupNorm statistics by the NHWC kernel, against the same network
# compiled + graphed without it (batch 32, as the engine's dense runs). (Twenty-second session; not yet run.)
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
r="fp16 channels_last compile+cudagraph"
python -m benchmarks.levers --only unet --batch unet=32 --budget 400 --json $OUT/levers_unet2.json \
  --levers "$r;$r, nhwc group norms" 2>&1 | tee $OUT/levers_unet2.log | grep "\[unet\]"
echo "done at $SECONDS s"
# then the norm alone per shape (decoder, UNet, Ditto), Inductor's kernels vs the NHWC statistics kernel
timeout $((580 - SECONDS)) python -m benchmarks.group_norm_bench --batch 32 --json $OUT/group_norm.json 2>&1 | grep -v Warn | tee $OUT/group_norm.log | grep "^|\|total"
echo "done at $SECONDS s"
