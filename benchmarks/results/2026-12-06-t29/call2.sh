# Twenty-ninth session, call 2 (warm, ~350-450 s): MuseTalk dense at 1080x1920 NV12 (audio features + render + splice,
# 165 frames of speech) for the variants call 1's render stage favoured, in one process. Buckets 8 and 32 only
# (NEWSSTUDIO_RENDER_BUCKETS=8,32; the 165 frames run as 5 x 32 + 8) so that a ':static' variant compiles twice, not six
# times; every variant gets the same buckets. Twenty-seventh session, H100, all buckets: 487.4 defaults / 492.6 rows104.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-590}
V=${V:-compile+cudagraph,compile+cudagraph:rows104}
NEWSSTUDIO_RENDER_BUCKETS=8,32 TORCH_LOGS=recompiles timeout $((L - SECONDS)) python -m benchmarks.musetalk_bench --size 1080x1920 \
  --repeat 2 --skip-reference --variants $V --json $OUT/musetalk_dense.json 2>&1 | grep -v Warn \
  | tee $OUT/musetalk_dense.log | grep "\[musetalk\]\|^|\|rror" | tail -16
echo "recompiles: $(grep -c 'Recompiling function' $OUT/musetalk_dense.log) at $SECONDS s"
echo "done at $SECONDS s"
