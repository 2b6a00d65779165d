# forty-first session, call 5: the RGB -> YUV step as scaled adds instead of GEMVs (splice_cost), then the dense
# and stride-4 Ditto figures and MuseTalk's dense figure with it (compare with calls 1-2 of this session, same kind of host)
source .carry/setup.sh
python -m benchmarks.host_speed 2>&1 | tail -1
python -m benchmarks.splice_cost --json $OUT/splice_cost.json 2>&1 | tail -6
python -m benchmarks.splice_cost --roi 256x320 --json $OUT/splice_cost_small.json 2>&1 | tail -4
timeout 230 python -m benchmarks.ditto_bench --skip-reference --variants compile+cudagraph --stride 4 --stride-psnr-modes mask --json $OUT/ditto_stride4b.json > $OUT/ditto_stride4b.log 2>&1
echo "rc $?"; grep -v WARNING $OUT/ditto_stride4b.log | grep "stride 4\*\|dense fps\|stride 4:" | tail -5
timeout 190 python -m benchmarks.musetalk_bench --skip-reference --variants compile+cudagraph --mp4 ultrafast:8/8/2 --json $OUT/musetalk_b.json > $OUT/musetalk_b.log 2>&1
echo "rc $?"; grep -v Warn $OUT/musetalk_b.log | grep "dense fps\|MP4\|segment" | tail -4
