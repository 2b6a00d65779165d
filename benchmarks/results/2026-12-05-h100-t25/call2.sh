# Twenty-fifth session, device call W2 (after W1 found the default statistics op failing to lower under Inductor; fixed by
# renaming its argument). (a) The MuseTalk engine with its defaults (the decoder's NHWC norms on, chunked statistics)
# from a cold machine: does it compile, how long is its warm-up, how many recompiles. (b) The VAE decoder alone: NHWC
# norms with chunked vs streaming statistics against PyTorch's norms, same run. (c) The engine without the norms.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-570}
TORCH_LOGS=recompiles timeout 300 python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference \
  --variants compile+cudagraph --json $OUT/musetalk_default.json 2>&1 | grep -v Warn | tee $OUT/musetalk_default.log | grep "\[musetalk\]\|^|\|Error\|error" | tail -16
echo "recompiles: $(grep -c 'Recompiling function' $OUT/musetalk_default.log) at $SECONDS s"
R="fp16 channels_last compile+cudagraph, conv rewrites"
timeout 140 python -m benchmarks.levers --only vae --batch vae=32 --budget 125 --json $OUT/levers_vae5.json \
  --levers "$R;$R, nhwc group norms + silu;$R, nhwc group norms + silu, streaming statistics" \
  2>&1 | grep -v Warn | tee $OUT/levers_vae5.log | grep "^|\|Error" | tail -6
left=$((L - SECONDS))
[ $left -gt 120 ] && timeout $left python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference \
  --variants compile+cudagraph:nogn --json $OUT/musetalk_nogn.json 2>&1 | grep -v Warn | tee $OUT/musetalk_nogn.log | grep "\[musetalk\]\|^|" | tail -16
echo "done at $SECONDS s"
