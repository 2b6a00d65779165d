# For the next GPU session's first call (~480 s warm, ~680 cold: give it the whole 600 s and L=560 on a cold machine):
# does the layout fix (1b9cd35: accel/layout.channels_last_dense) put all 29 4-D decoder norms on the NHWC kernels on the
# device's torch 2.11, and what does it do to the engine? (a) norm_paths (expect 29 kernel / 1 fallback, the attention's
# 3-D norm, in both variants; the twenty-eighth session's call 3 had 19 / 11 and 20 / 10); (b) MuseTalk dense, defaults
# vs ':rows104' (twenty-seventh session on an H100: 487.4 / 492.6 frames/s; twenty-eighth, render stage 519.6 / 470.8).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-590}
timeout 90 python -m benchmarks.norm_paths --json $OUT/norm_paths.json 2>&1 | grep -v "Warn\|WARNING: MuseTalk" \
  | tee $OUT/norm_paths.log | grep "==" 
echo "(a) done at $SECONDS s"
TORCH_LOGS=recompiles timeout $((L - SECONDS)) python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference \
  --variants compile+cudagraph,compile+cudagraph:rows104 --json $OUT/musetalk_rows.json 2>&1 | grep -v Warn \
  | tee $OUT/musetalk_rows.log | grep "\[musetalk\]\|^|\|rror" | tail -16
echo "recompiles: $(grep -c 'Recompiling function' $OUT/musetalk_rows.log) at $SECONDS s"
echo "done at $SECONDS s"
