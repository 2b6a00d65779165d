# forty-first session, call 5: the RGB -> YUV step as scaled adds instead of GEMVs (splice_cost), then Ditto's dense and
# stride-4 figures with it (compare with call 2 of this session, same kind of host), the MP4 with the ramped chunks
source .carry/setup.sh
python -m benchmarks.host_speed 2>&1 | tail -1
python -m benchmarks.splice_cost --json $OUT/splice_cost.json 2>&1 | tail -6
timeout 150 python -m benchmarks.ditto_bench --repeat 2 --skip-reference --variants compile+cudagraph --stride 4 --stride-psnr-modes mask --mp4 ultrafast:12/8/1~8 --json $OUT/ditto_stride4b.json > $OUT/ditto_stride4b.log 2>&1
echo "rc $?"; grep -v WARNING $OUT/ditto_stride4b.log | grep "stride 4\|dense fps\|MP4" | tail -6
