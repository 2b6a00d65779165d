# Thirty-seventh session, call C (cold, what the budget left after refusals allows): Ditto's render runner alone at 32
# frames with the decoder folds off and on (one process, each one's top kernels), then Ditto dense 1080x1920 NV12 with
# the defaults (folds on) in what time remains.
. .carry/setup.sh; set -o pipefail
L=${L:-480}
python -c "import time; t=time.perf_counter(); s=0
for i in range(1000000): s+=i
print(f'1M-step Python loop {1e3*(time.perf_counter()-t):.0f} ms')"
NEWSSTUDIO_RENDER_BUCKETS=32 timeout -s ABRT $((L * 55 / 100)) python -X faulthandler -m benchmarks.bucket_timing --engine ditto \
  --accel compile+cudagraph --sizes 32 --iters 30 --decoder-folds off,on --kernels 25 --json $OUT/bucket_ditto_folds.json \
  2>&1 | grep -v Warning | tail -70
echo "(a) done at $SECONDS s"
timeout -s ABRT $((L - SECONDS)) python -X faulthandler -m benchmarks.ditto_bench --size 1080x1920 --skip-reference \
  --variants compile+cudagraph --repeat 2 --chunk 32 --json $OUT/ditto_default.json 2>&1 | grep -v Warn \
  | tee $OUT/ditto_default.log | grep "\[ditto\]\|^|\|rror" | tail -20
echo "done at $SECONDS s"
