# For the next GPU session (~300 s warm), preferably on an H200 (the goal's machine): MuseTalk dense with the default
# (lower-face decoder) vs the whole face (':rows0'), all render buckets (so the time to first frame is comparable with
# earlier sessions'), three runs each. Twenty-ninth session, H100, buckets 8 and 32: 596.6 / 475.9 frames/s.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-590}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 3 --skip-reference \
  --variants compile+cudagraph,compile+cudagraph:rows0 --json $OUT/musetalk_default.json 2>&1 | grep -v Warn \
  | tee $OUT/musetalk_default.log | grep "\[musetalk\]\|^|\|rror" | tail -16
echo "recompiles: $(grep -c 'Recompiling function' $OUT/musetalk_default.log) at $SECONDS s"
echo "done at $SECONDS s"
