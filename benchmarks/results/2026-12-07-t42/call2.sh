# forty-second session, call 2 (same warm host): Ditto stride 8 with the ramped MP4 (may meet the 0.6 s goal)
source .carry/setup.sh
timeout 300 python -m benchmarks.ditto_bench --skip-reference --variants compile+cudagraph --stride 8 --stride-psnr-modes mask --mp4 ultrafast:12/8/1~8 --json $OUT/ditto_stride8.json > $OUT/ditto_stride8.log 2>&1
echo "rc $?"; grep -v WARNING $OUT/ditto_stride8.log | grep "fps\|stride\|MP4\|memory\|load" | tail -16
