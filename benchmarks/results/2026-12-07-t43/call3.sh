# forty-third session, call 3 (call1 + call2 in one device call, after many refused starts): the CUDA stride tests
# (host rows = device rows, no sync), stride 8's MP4 with host rows and again with device rows for two encoder
# configurations, then live Ditto stride-4 sessions (S, default 12) with host rows and with device rows.
source .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 90 python -m pytest -q -p no:cacheprovider tests/test_ditto_stride.py -k "cuda or runner or idle" 2>&1 | tail -3
echo "tests done at $SECONDS s"
timeout ${L:-300} python -m benchmarks.ditto_bench --skip-reference --variants compile+cudagraph --repeat 2 --stride 8 \
  --stride-psnr-modes mask --stride-device-rows --mp4 "ultrafast:12/8/1~8,ultrafast:8/8/1" \
  --json $OUT/ditto_stride8_mp4.json > $OUT/ditto_stride8_mp4.log 2>&1; echo "bench rc $? at $SECONDS s"
grep -v WARNING $OUT/ditto_stride8_mp4.log | grep "MP4\|stride 8\|dense fps\|first frame" | tail -12
for ROWS in host device; do
  left=$((${END:-585} - SECONDS)); [ $left -lt 60 ] && break
  NEWSSTUDIO_STRIDE_ROWS=$ROWS timeout -s ABRT $(( left < 150 ? left : 150 )) python -X faulthandler -m benchmarks.load_test \
    --engine ditto --fps 30 --weights random --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 8 \
    --render-leads 0.15 --send-on-clock on --warm-up-s 5 --duration 30 --sessions ${S:-12} --ditto-stride ${K:-4} \
    --json $OUT/load_stride_$ROWS.json > $OUT/load_stride_$ROWS.log 2>&1; echo "$ROWS rows: rc $? at $SECONDS s"
  grep "ready after\|level of" $OUT/load_stride_$ROWS.log; python -m benchmarks.load_summary $OUT/load_stride_$ROWS.json
done
