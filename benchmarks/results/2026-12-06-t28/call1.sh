# Twenty-eighth session, call 1 (~420 s warm): why decoding rows 104-255 only gained 1 % in the engine (t27); after
# the fix of aa6719a (cut maps kept channels-last contiguous).
# (a) the decoder alone at batch 32, graphed, now also over the engine's NHWC-norm decoder ("engine lower 104");
# (b) kernel profiles of engine.render (batch 32, yongen 1080x1920) for the defaults and ':rows104'.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 200 python -m benchmarks.lower_face_decoder --batch 32 --first-rows 104 --compile-mode default --faces 4 \
  --json $OUT/lower_face_decoder.json 2>&1 | grep -v "Warn\|AUTOTUNE\|^strides\|^dtypes\|SingleProcess\|num_choices" \
  | tee $OUT/lower_face_decoder.log | grep -- "---\|GFLOP\|rror"
echo "(a) done at $SECONDS s"
timeout $((585 - SECONDS)) python -m benchmarks.render_profile --variants compile+cudagraph,compile+cudagraph:rows104 \
  --profiled 5 --json $OUT/render_profile.json 2>&1 | grep -v "Warn\|AUTOTUNE\|^strides\|^dtypes\|SingleProcess\|num_choices\|USDT" \
  | tee $OUT/render_profile.log | grep -v "WARNING: MuseTalk" | tail -70
echo "done at $SECONDS s"
