# The exact rewrites checked on CUDA (incl. the NHWC norms in both decoders); Ditto's warp + decoder and
# MuseTalk's UNet with the NHWC norm statistics against the same networks without them (compiled + graphed).
# (Twenty-second session; not yet run.) ~400 s.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 90 python -m benchmarks.rewrite_check --batch 8 2>&1 | grep -v Warn | tee $OUT/rewrite_check.log
r="fp16 channels_last compile+cudagraph"
timeout 240 python -m benchmarks.levers --only ditto --batch ditto=16 --budget 220 --json $OUT/levers_ditto2.json \
  --levers "$r, conv rewrites;$r, conv rewrites, nhwc group norms" 2>&1 | tee $OUT/levers_ditto2.log | grep "\[ditto\]"
timeout $((585 - SECONDS)) python -m benchmarks.levers --only unet --batch unet=32 --budget $((560 - SECONDS)) --json $OUT/levers_unet2.json \
  --levers "$r;$r, nhwc group norms" 2>&1 | tee $OUT/levers_unet2.log | grep "\[unet\]"
echo "done at $SECONDS s"
