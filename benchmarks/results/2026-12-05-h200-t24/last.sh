# The session's last ~60 s of device time: Ditto's SPADE norms per shape (group_norm_bench --spade, batch 32),
# Inductor vs the NHWC kernels (chunked and streaming statistics); rows print as they finish.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout $((${L:-60} - SECONDS)) python -m benchmarks.group_norm_bench --spade --batch 32 --iters 10 --json $OUT/spade_norms.json 2>&1 \
  | grep -v Warn | tee $OUT/spade_norms.log | tail -9
echo "done at $SECONDS s"
