# The norm alone per shape (MuseTalk decoder + UNet, Ditto), Inductor's kernels vs the NHWC statistics kernel (and vs it with the NHWC apply + SiLU kernel);
# then the decoder's levers that matter, compiled + graphed, batch 32: cuDNN (the engine's),
# cuDNN with the channel-minor phase interleave, with the NHWC norms (and both; and with the norms' SiLU in
# the NHWC apply kernel), the Triton convs half / mixed.
# (Written in the twenty-first session, extended in the twenty-second; not yet run.) ~450 s.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 240 python -m benchmarks.group_norm_bench --batch 32 --json $OUT/group_norm.json 2>&1 | grep -v Warn | tee $OUT/group_norm.log | grep "^|\|total"
r="fp16 channels_last compile+cudagraph, conv rewrites"
timeout $((585 - SECONDS)) python -m benchmarks.levers --only vae --batch vae=32 --budget 330 --json $OUT/levers_vae2.json \
  --levers "$r;$r, channels-last interleave;$r, nhwc group norms;$r, channels-last interleave, nhwc group norms;$r, channels-last interleave, nhwc group norms + silu;$r, triton half convs;$r, triton mixed convs" \
  2>&1 | tee $OUT/levers_vae2.log | grep "\[vae\]"
echo "done at $SECONDS s"
