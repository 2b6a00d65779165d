# The forty-second session's open measurements, one device call each (any H100/H200 host); PART picks one:
#   PART=stride_mp4      Ditto stride 8's MP4 per encoder configuration, compiled defaults (~300 s cold): whole
#                        32-frame chunks vs the ramp, 8 vs 12 x264 workers, each with "these chunks rendered alone"
#   PART=stride_streams  live Ditto sessions in stride mode (k = 4), 30 s levels of 12 and 16 (~250 s)
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
case ${PART:?set PART=stride_mp4 or stride_streams} in
stride_mp4)
  timeout ${L:-560} python -m benchmarks.ditto_bench --skip-reference --variants compile+cudagraph --repeat 2 --stride 8 \
    --stride-psnr-modes mask --mp4 "ultrafast:12/8/1~8,ultrafast:12/8/1,ultrafast:8/8/1~8,ultrafast:8/8/1" \
    --json $OUT/ditto_stride8_mp4.json > $OUT/ditto_stride8_mp4.log 2>&1; echo "rc $?"
  grep -v WARNING $OUT/ditto_stride8_mp4.log | grep "MP4\|stride 8" | tail -12 ;;
stride_streams)
  timeout -s ABRT ${L:-400} python -X faulthandler -m benchmarks.load_test --engine ditto --fps 30 --weights random \
    --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 8 --render-leads 0.15 --send-on-clock on \
    --warm-up-s 5 --duration 30 --sessions ${S:-12,16} --ditto-stride ${K:-4} \
    --json $OUT/load_ditto_stride.json > $OUT/load_ditto_stride.log 2>&1; echo "rc $?"
  grep "ready after\|level of" $OUT/load_ditto_stride.log; python -m benchmarks.load_summary $OUT/load_ditto_stride.json ;;
esac
echo "done at $SECONDS s"
