# If a Triton row won in call2 (after the interleave fix): the Triton decoder with the NHWC norm statistics
# too, against cuDNN with them, then the engine with both. (Twenty-second session; not yet run.)
# V: the engine variants to time, e.g. V=compile+cudagraph:gn:triton,compile+cudagraph:gn:triton8m
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
r="fp16 channels_last compile+cudagraph, conv rewrites"
python -m benchmarks.levers --only vae --batch vae=32 --budget 250 --json $OUT/levers_vae3.json \
  --levers "$r, nhwc group norms;$r, triton half convs, nhwc group norms;$r, triton mixed convs, nhwc group norms" \
  2>&1 | tee $OUT/levers_vae3.log | grep "\[vae\]"
timeout $((585 - SECONDS)) python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference \
  --variants compile+cudagraph:gn,${V} --mp4 ultrafast:8/8/2 --json $OUT/musetalk_tgn.json 2>&1 | grep -v Warn | tee $OUT/musetalk_tgn.log | grep "\[musetalk\] ours\|^|" | tail -20
echo "done at $SECONDS s"
