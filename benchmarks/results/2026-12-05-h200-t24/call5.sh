# Twenty-fourth session, last device call (~240 s left): call4.sh's part (a) only, Ditto's warp + decoder alone,
# compiled + graphed, batch 32, with the SPADE norms on the NHWC kernels against the engine's configuration.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-220}
R="fp16 channels_last compile+cudagraph, conv rewrites"
timeout $((L - SECONDS)) python -m benchmarks.levers --only ditto --batch ditto=32 --budget $((L - SECONDS - 15)) \
  --json $OUT/levers_ditto_spade.json --levers "$R;$R, nhwc spade norms" \
  2>&1 | grep -v Warn | tee $OUT/levers_ditto_spade.log | grep "^|" | tail -8
echo "done at $SECONDS s"
