# Twenty-fifth session, first device call: the norm kernels written after this session's runs.
# (a) per shape, batch 32: GroupNorm + SiLU with the "chunked" (measured) and "streaming" statistics kernels against
# Inductor; Ditto's SPADE norms (norm + modulation + LeakyReLU) on the kernels against Inductor, weighted by the
# decoder's counts. (b) the VAE decoder alone with the streaming statistics. (c) Ditto's warp + decoder alone with the
# SPADE norms on the kernels, both statistics kernels. Log names without '+'.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-560}
timeout 100 python -m benchmarks.group_norm_bench --batch 32 --json $OUT/group_norm.json 2>&1 | grep -v Warn | tee $OUT/group_norm.log | tail -14
timeout 80 python -m benchmarks.group_norm_bench --spade --batch 32 --json $OUT/spade_norms.json 2>&1 | grep -v Warn | tee $OUT/spade_norms.log | tail -8
R="fp16 channels_last compile+cudagraph, conv rewrites"
timeout 130 python -m benchmarks.levers --only vae --batch vae=32 --budget 115 --json $OUT/levers_vae4.json \
  --levers "$R;$R, nhwc group norms + silu;$R, nhwc group norms + silu, streaming statistics" \
  2>&1 | grep -v Warn | tee $OUT/levers_vae4.log | grep "^|" | tail -6
left=$((L - SECONDS))
timeout $left python -m benchmarks.levers --only ditto --batch ditto=32 --budget $((left - 15)) --json $OUT/levers_ditto5.json \
  --levers "$R;$R, nhwc spade norms;$R, nhwc spade norms, streaming statistics" \
  2>&1 | grep -v Warn | tee $OUT/levers_ditto5.log | grep "^|" | tail -6
echo "done at $SECONDS s"
