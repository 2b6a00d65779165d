# forty-fourth session, call 2 (END=300 L=290: the MP4 part alone): stride 8's MP4 (host rows, the default) with more x264 configurations now that the render
# is no longer slowed by the encoder (call 1: chunks in hand by 0.21 s, the MP4 0.61 s, x264 + AAC alone 0.53 s); then,
# with what is left of END, a live level of S (default 12, call 1's level: now with every stream's keyframes in one call per shared batch) Ditto stride-4 sessions with host rows and with device rows.
source .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout ${L:-330} python -m benchmarks.ditto_bench --skip-reference --variants compile+cudagraph --repeat 3 --stride 8 \
  --stride-psnr-modes mask --mp4 "ultrafast:12/8/1~8,ultrafast:14/8/1~8,ultrafast:16/8/1~8,ultrafast:16/4/1~4" \
  --json $OUT/ditto_stride8_mp4.json > $OUT/ditto_stride8_mp4.log 2>&1; echo "bench rc $? at $SECONDS s"
grep -v WARNING $OUT/ditto_stride8_mp4.log | grep "MP4\|stride 8\|dense fps\|first frame" | tail -14
for ROWS in host device; do
  left=$((${END:-585} - SECONDS)); [ $left -lt 100 ] && break
  NEWSSTUDIO_STRIDE_ROWS=$ROWS timeout -s ABRT $(( left < 150 ? left : 150 )) python -X faulthandler -m benchmarks.load_test \
    --engine ditto --fps 30 --weights random --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 8 \
    --render-leads 0.15 --send-on-clock on --warm-up-s 5 --duration 30 --sessions ${S:-12} --ditto-stride ${K:-4} \
    --json $OUT/load_stride_$ROWS.json > $OUT/load_stride_$ROWS.log 2>&1; echo "$ROWS rows: rc $? at $SECONDS s"
  grep "ready after\|level of" $OUT/load_stride_$ROWS.log; python -m benchmarks.load_summary $OUT/load_stride_$ROWS.json
done
