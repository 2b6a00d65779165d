# forty-second session, call 1: the GPU A/B of the RGB -> YUV change (splice_cost, both forms in one process), then
# Ditto dense + stride 4 with it and with the stream-sized keyframe buckets (compare 312.8 / 677.3 of the forty-first)
source .carry/setup.sh
python -m benchmarks.host_speed 2>&1 | tail -1
timeout 40 python -m benchmarks.splice_cost --json $OUT/splice_cost.json 2>&1 | grep -v WARNING | tail -8
timeout 30 python -m benchmarks.splice_cost --roi 256x320 --json $OUT/splice_cost_roi.json 2>&1 | grep -v WARNING | tail -8
timeout 330 python -m benchmarks.ditto_bench --skip-reference --variants compile+cudagraph --stride 4 --stride-psnr-modes mask --mp4 ultrafast:12/8/1~8 --json $OUT/ditto_stride4.json > $OUT/ditto_stride4.log 2>&1
echo "rc $?"; grep -v WARNING $OUT/ditto_stride4.log | grep "fps\|stride\|MP4\|memory\|load" | tail -16
