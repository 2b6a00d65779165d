# forty-fourth session, call 3 (the budget's last ~240 s): stride 8's MP4 with 16 x264 workers next to call 1's 12.
source .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout ${L:-220} python -m benchmarks.ditto_bench --skip-reference --variants compile+cudagraph --repeat 2 --stride 8 \
  --stride-psnr-modes mask --mp4 "ultrafast:16/8/1~8,ultrafast:12/8/1~8" \
  --json $OUT/ditto_stride8_mp4.json > $OUT/ditto_stride8_mp4.log 2>&1; echo "bench rc $? at $SECONDS s"
grep -v WARNING $OUT/ditto_stride8_mp4.log | grep "MP4\|stride 8\|dense fps\|first frame\|fps, TTFF" | tail -14
