# For the next session (not yet run; ~450 s): the MuseTalk engine with its defaults (NHWC norms, streaming statistics)
# on an H200, for the summary table (the twenty-fourth session's 497.1 used the chunked statistics), then with the
# Triton convs (':triton', auto per shape) if next1.sh shows them close. Reference skipped.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-560}
for v in ${VARIANTS:-compile+cudagraph compile+cudagraph:triton}; do
  left=$((L - SECONDS)); [ $left -gt 200 ] || break
  name=musetalk_$(echo $v | tr '+:' '__')
  TORCH_LOGS=recompiles timeout $left python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference \
    --variants $v --json $OUT/$name.json 2>&1 | grep -v Warn | tee $OUT/$name.log | grep "\[musetalk\]\|^|\|rror" | tail -16
  echo "recompiles: $(grep -c 'Recompiling function' $OUT/$name.log) at $SECONDS s"
done
echo "done at $SECONDS s"
