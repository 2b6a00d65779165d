# For the next GPU session, after next1.sh (~420 s warm): the kernel tables of both MuseTalk variants after the layout
# fix (where the time of ':rows104' goes if it still does not pay), then Ditto dense with its defaults, which the same
# fix touches (its NHWC norms and phase upsamplers; twelfth session 301.3, eleventh 303.8 frames/s on the H200).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-590}
timeout 280 python -m benchmarks.render_profile --variants compile+cudagraph,compile+cudagraph:rows104 --profiled 3 \
  --top 24 --json $OUT/render_profile.json 2>&1 | grep -v "Warn\|AUTOTUNE\|^strides\|^dtypes\|SingleProcess\|num_choices\|USDT\|statistics:" \
  | tee $OUT/render_profile.log | grep -v "WARNING: MuseTalk" | tail -52
echo "(a) done at $SECONDS s"
timeout $((L - SECONDS)) python -m benchmarks.ditto_bench --size 1080x1920 --skip-reference --variants compile+cudagraph \
  --repeat 2 --chunk 32 --json $OUT/ditto_default.json 2>&1 | grep -v Warn | tee $OUT/ditto_default.log | grep "\[ditto\]\|^|\|rror" | tail -14
echo "done at $SECONDS s"
