# For the next session (not yet run): Ditto's SPADE norms on the NHWC kernels (statistics, then norm + modulation +
# LeakyReLU in one pass; commit after 6d5a2c4). (a) warp + decoder alone, compiled + graphed, batch 32, against the
# engine's configuration and the fp32 reference; (b) the Ditto engine with ':gn' and without, one process each.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-580}
R="fp16 channels_last compile+cudagraph, conv rewrites"
timeout 240 python -m benchmarks.levers --only ditto --batch ditto=32 --budget 210 --json $OUT/levers_ditto_spade.json \
  --levers "$R;$R, nhwc spade norms" 2>&1 | grep -v Warn | tee $OUT/levers_ditto_spade.log | grep "^|" | tail -8
for v in compile+cudagraph:gn compile+cudagraph; do
  left=$((L - SECONDS)); [ $left -gt 150 ] || break
  name=ditto_$(echo $v | tr '+:' '__')
  timeout $left python -m benchmarks.ditto_bench --size 1080x1920 --repeat 2 --skip-reference \
    --variants $v --json $OUT/$name.json 2>&1 | grep -v Warn | tee $OUT/$name.log | grep "\[ditto\]\|^|" | tail -16
done
echo "done at $SECONDS s"
