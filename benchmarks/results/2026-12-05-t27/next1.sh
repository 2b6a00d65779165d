# For the next GPU session (~450 s cold): does decoding only the face rows the blend uses pay, end to end?
# The MuseTalk engine dense at 1080x1920 NV12, its defaults vs ':rows104' (MuseTalkEngine(first_face_row=104)), one
# process, reference skipped. Keep first_face_row=0 (the default) unless dense gains clearly (>= ~8 %).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-570}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference \
  --variants compile+cudagraph,compile+cudagraph:rows104 --json $OUT/musetalk_rows.json 2>&1 | grep -v Warn \
  | tee $OUT/musetalk_rows.log | grep "\[musetalk\]\|^|\|rror" | tail -16
echo "recompiles: $(grep -c 'Recompiling function' $OUT/musetalk_rows.log) at $SECONDS s"
echo "done at $SECONDS s"
