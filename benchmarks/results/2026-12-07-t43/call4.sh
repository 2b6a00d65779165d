# forty-third session, call 4 (the short-budget form of call3, after ten refused starts): plain CUDA graphs (no
# compile, so relative figures only), the CUDA stride tests, then stride 8's MP4 with host rows and with device rows
# in one process; a live stride level only if at least 150 s are left of END.
source .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 90 python -m pytest -q -p no:cacheprovider tests/test_ditto_stride.py -k "cuda or runner or idle" 2>&1 | tail -3
echo "tests done at $SECONDS s"
timeout ${L:-220} python -m benchmarks.ditto_bench --skip-reference --variants cudagraph --repeat 2 --stride 8 \
  --stride-psnr-modes mask --stride-device-rows --mp4 "ultrafast:12/8/1~8,ultrafast:8/8/1" \
  --json $OUT/ditto_stride8_mp4.json > $OUT/ditto_stride8_mp4.log 2>&1; echo "bench rc $? at $SECONDS s"
grep -v WARNING $OUT/ditto_stride8_mp4.log | grep "MP4\|stride 8\|dense fps\|first frame" | tail -12
left=$((${END:-380} - SECONDS))
if [ $left -ge 150 ]; then
  timeout -s ABRT $left python -X faulthandler -m benchmarks.load_test --engine ditto --fps 30 --weights random --size 1080 \
    --accel cudagraph --client-processes 4 --render-aheads 8 --render-leads 0.15 --send-on-clock on --warm-up-s 5 \
    --duration 30 --sessions ${S:-12} --ditto-stride ${K:-4} --json $OUT/load_stride_host.json > $OUT/load_stride_host.log 2>&1
  echo "host rows: rc $? at $SECONDS s"; grep "ready after\|level of" $OUT/load_stride_host.log
  python -m benchmarks.load_summary $OUT/load_stride_host.json
fi
