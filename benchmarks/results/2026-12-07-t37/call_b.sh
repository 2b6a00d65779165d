# Thirty-seventh session, call B (cold): Ditto dense 1080x1920 NV12 with the decoder folds off and on (one process,
# ours only), then the render runner alone at 32 frames, both decoders, with each one's top kernels.
. .carry/setup.sh; set -o pipefail
L=${L:-560}
python -c "import time; t=time.perf_counter(); s=0
for i in range(1000000): s+=i
print(f'1M-step Python loop {1e3*(time.perf_counter()-t):.0f} ms')"
timeout -s ABRT $((L - 200)) python -X faulthandler -m benchmarks.ditto_bench --size 1080x1920 --skip-reference \
  --variants compile+cudagraph:nofold,compile+cudagraph --repeat 2 --chunk 32 --mp4 ultrafast:8/8/2 \
  --json $OUT/ditto_folds.json 2>&1 | grep -v Warn | tee $OUT/ditto_folds.log | grep "\[ditto\]\|^|\|rror" | tail -30
echo "(a) done at $SECONDS s"
export NEWSSTUDIO_RENDER_BUCKETS=32
timeout -s ABRT $((L - SECONDS)) python -X faulthandler -m benchmarks.bucket_timing --engine ditto --accel compile+cudagraph \
  --sizes 32 --iters 30 --decoder-folds off,on --kernels 25 --json $OUT/bucket_ditto_folds.json 2>&1 | grep -v Warning | tail -70
echo "done at $SECONDS s"
