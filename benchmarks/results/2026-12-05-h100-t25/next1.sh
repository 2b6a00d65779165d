# For the next session's first device call (not yet run; ~500 s). Why the Triton convolutions, 15 % faster than cuDNN per
# layer shape, lose in the whole compiled decoder: (a) the engine's decoder compiled with cuDNN / Triton half / Triton
# mixed (FP8 on the full-resolution block), ms per batch of 32 with and without a CUDA graph and the device time by
# kernel kind; (b) the same three as levers rows with their error vs fp32. Log names without '+'.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-560}
timeout 330 python -m benchmarks.decoder_kernels --batch 32 --convs off,half,mixed --json $OUT/decoder_kernels.json \
  2>&1 | grep -v Warn | tee $OUT/decoder_kernels.log | grep -v "^USDT" | tail -60
left=$((L - SECONDS))
S="fp16 channels_last compile+cudagraph, conv rewrites"
timeout $left python -m benchmarks.levers --only vae --batch vae=32 --budget $((left - 15)) --json $OUT/levers_vae6.json \
  --levers "$S, nhwc group norms + silu, streaming statistics;$S, triton half convs, nhwc group norms + silu, streaming statistics;$S, triton mixed convs, nhwc group norms + silu, streaming statistics" \
  2>&1 | grep -v Warn | tee $OUT/levers_vae6.log | grep "^|" | tail -6
echo "done at $SECONDS s"
