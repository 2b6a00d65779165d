# For the next session (not yet run; after next1.sh, if its levers rows show the SPADE norms pay): the Ditto engine
# with its SPADE norms on the NHWC kernels (':gn') and without, one process each, reference skipped.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-580}
for v in compile+cudagraph:gn compile+cudagraph; do
  left=$((L - SECONDS)); [ $left -gt 150 ] || break
  name=ditto_$(echo $v | tr '+:' '__')
  timeout $left python -m benchmarks.ditto_bench --size 1080x1920 --repeat 2 --skip-reference \
    --variants $v --json $OUT/$name.json 2>&1 | grep -v Warn | tee $OUT/$name.log | grep "\[ditto\]\|^|" | tail -16
done
echo "done at $SECONDS s"
