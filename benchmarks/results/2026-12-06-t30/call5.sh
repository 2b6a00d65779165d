# Thirtieth session, call 5 (cold; ~280 s of command): MuseTalk dense with the new default render compile (the largest
# bucket, 32, compiled at its static batch; the smaller buckets share the dynamic-batch compile), all buckets, three runs.
# Same machine kind earlier this session: dynamic everywhere 590.8, every bucket static 638.1 frames/s.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-280}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 3 --skip-reference \
  --variants compile+cudagraph --json $OUT/musetalk_largest_static.json 2>&1 | grep -v Warn \
  | tee $OUT/musetalk_largest_static.log | grep "\[musetalk\]\|^|\|rror\|engine load" | tail -16
echo "recompiles: $(grep -c 'Recompiling function' $OUT/musetalk_largest_static.log) at $SECONDS s"
