# After the channels-last phase interleave: the compiled decoder's kernels (cuDNN vs Triton), then
# the levers rows that matter (cuDNN baseline, Triton half, Triton mixed), compiled + graphed.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 170 python benchmarks/results/2026-12-05-h200-t21/diag_compiled_vae.py 2>&1 | grep -v Warn > $OUT/diag_compiled2.log
grep "ms/batch" $OUT/diag_compiled2.log
python -m benchmarks.levers --only vae --batch vae=32 --levers "fp16 channels_last compile+cudagraph, conv rewrites;fp16 channels_last compile+cudagraph, conv rewrites, triton half convs;fp16 channels_last compile+cudagraph, conv rewrites, triton mixed convs" --budget 300 --json $OUT/levers_vae2.json 2>&1 | tee $OUT/levers_vae2.log | grep "\[vae\]"
echo "done at $SECONDS s"
