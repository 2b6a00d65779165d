# Twenty-fourth session, the last ~150 s of device time: Ditto's SPADE norms alone per shape (compiled, batch 32,
# fp16 channels-last), Inductor vs the NHWC statistics + modulation kernels, weighted by the decoder's norm counts.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 110 python -m benchmarks.group_norm_bench --spade --batch 32 --json $OUT/spade_norms.json 2>&1 | grep -v Warn \
  | tee $OUT/spade_norms.log | tail -9
echo "done at $SECONDS s"
