# For the next GPU session (cold, ~450 s): Ditto's convolutions on Hopper kernels. The thirty-seventh session's kernel
# table put one Ampere-generation cuDNN kernel (mma.sync) at 17 % of the render runner, most likely the dense-motion
# mask conv (7x7, 144 -> 168 over depth slices). (1) per conv shape: cuDNN vs our Triton implicit GEMM (wgmma, TMA);
# (2) the engine dense: cuDNN, the mask conv alone on the Triton kernel (`:tritonsel`), every eligible conv with the
# kernel chosen per shape (`:triton`, kernel "auto"), one process.
# Needs the yongen clip: move /work/carry_media_spare back to .carry/media (and py_spy out of .whl for the 64 MiB limit).
. .carry/setup.sh; set -o pipefail
L=${L:-560}
timeout -s ABRT 200 python -X faulthandler -m benchmarks.triton_conv_bench --engine ditto --batch 32 --iters 20 \
  --json $OUT/triton_conv_ditto.json 2>&1 | grep -v "Warn\|AUTOTUNE" | tail -40
echo "(1) done at $SECONDS s"
timeout -s ABRT $((L - SECONDS)) python -X faulthandler -m benchmarks.ditto_bench --size 1080x1920 --skip-reference \
  --variants compile+cudagraph,compile+cudagraph:tritonsel,compile+cudagraph:triton --repeat 2 --chunk 32 --json $OUT/ditto_triton.json 2>&1 \
  | grep -v Warn | tee $OUT/ditto_triton.log | grep "\[ditto\]\|^|\|rror" | tail -24
echo "done at $SECONDS s"
