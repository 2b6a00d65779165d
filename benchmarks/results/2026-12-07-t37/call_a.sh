# Thirty-seventh session, call A: Ditto's render runner (warp + decoder, compile + CUDA graphs) with the decoder's
# decoder folds off vs on (the learned shortcuts with SPADE's beta through their 1x1 conv, and the 4x phase upsampling's alike middle phases computed once), one engine each, buckets 8 and 32 only.
. .carry/setup.sh; set -o pipefail
export NEWSSTUDIO_RENDER_BUCKETS=8,32
python -c "import time; t=time.perf_counter(); s=0
for i in range(1000000): s+=i
print(f'1M-step Python loop {1e3*(time.perf_counter()-t):.0f} ms')"
timeout -s ABRT ${LB:-330} python -X faulthandler -m benchmarks.bucket_timing --engine ditto --accel compile+cudagraph \
  --sizes 8,32 --iters 30 --decoder-folds off,on --kernels 25 --json $OUT/bucket_ditto_fold.json 2>&1 | grep -v Warning | tail -70
echo "done at $SECONDS s"
