# For the next session (~300 s): the compiled decoder with cuDNN vs the Triton half convs again, this time with the
# JSON and the per-shape choice log (the twenty-sixth session's run timed out in 'mixed' before writing them): do
# the per-shape timings that picked Triton (kernel_choice.fastest, do_bench with L2 flushes) disagree with the
# 26.3 ms the Triton convs took in the graph?
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout ${L:-400} python -m benchmarks.decoder_kernels --batch 32 --convs off,half --json $OUT/decoder_kernels2.json \
  2>&1 | grep -v "Warn\|AUTOTUNE\|triton_convolution\|^strides\|^dtypes\|^  convolution\|SingleProcess\|num_choices" \
  | tee $OUT/decoder_kernels2.log | tail -70
echo "done at $SECONDS s"
