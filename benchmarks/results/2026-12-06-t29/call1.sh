# Twenty-ninth session, call 1 (~450 s warm; give it the whole 600 s cold): the render stage (engine.render, batch 32,
# yongen 1080x1920) after the layout fix (1b9cd35: stride test for the NHWC norms and phase interleaves under the
# dynamic batch), defaults vs ':static' (each bucket compiled at its own batch size, 1ddd9da) vs ':rows104' (the
# lower-face decoder) vs both. Twenty-eighth session, H100, before the fix: defaults 61.58 ms, rows104 67.97 ms.
# Only bucket 32 is built (NEWSSTUDIO_RENDER_BUCKETS=32): one compile per variant. Then norm_paths on CUDA if time is left.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-560}
V=${V:-compile+cudagraph,compile+cudagraph:rows104,compile+cudagraph:static,compile+cudagraph:rows104:static}
NEWSSTUDIO_RENDER_BUCKETS=32 TORCH_LOGS=recompiles timeout $((L - 70)) python -m benchmarks.render_profile --variants $V \
  --max-frames 40 --repeat 15 --profiled 3 --top 14 --json $OUT/render_profile.json 2>&1 \
  | grep -v "Warn\|AUTOTUNE\|^strides\|^dtypes\|SingleProcess\|num_choices\|USDT\|statistics:" \
  | tee $OUT/render_profile.log | grep -v "WARNING: MuseTalk" | grep "==\|rror\|Recompiling\|guard fail\|  - " | head -40
echo "(a) done at $SECONDS s"
[ $((L - SECONDS)) -gt 60 ] && timeout $((L - SECONDS)) python -m benchmarks.norm_paths --json $OUT/norm_paths.json 2>&1 | grep -v "Warn\|WARNING: MuseTalk" \
  | tee $OUT/norm_paths.log | grep "==\|fallback" | head -12
echo "done at $SECONDS s"
