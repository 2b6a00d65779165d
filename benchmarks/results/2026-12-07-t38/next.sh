# For the next GPU session (cold, ~120 s; no media needed): does cuDNN choose a Hopper (wgmma) kernel for Ditto's
# depth-sliced mask conv (7x7 over 512 slices of 64x64, now padded 144 -> 168 channels, 14.3 ms on an Ampere-generation
# kernel at batch 32) at another channel padding? If one padding beats 14.3 ms by more than its extra FLOPs, make
# DepthSlicedConv3d's padding per conv (accel/depth_sliced_conv3d.py, `align`) and time the runner:
# `NEWSSTUDIO_RENDER_BUCKETS=32 python -m benchmarks.bucket_timing --engine ditto --accel compile+cudagraph --sizes 32 --iters 30 --kernels 25`.
. .carry/setup.sh; set -o pipefail
timeout -s ABRT 200 python benchmarks/results/2026-12-07-t38/mask_conv_shapes.py 2>&1 | tail -20
echo "done at $SECONDS s"
