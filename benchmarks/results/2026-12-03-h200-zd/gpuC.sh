. .carry/setup.sh
set -o pipefail
date -u
# 1: Ditto segment -> MP4 (run ZC: 0.80 s vs 0.55 s of dense render and 0.40 s of x264 alone): fewer encoder
# workers (cores left for the render thread) and the GIL switch interval 0.5 ms (@0.5) vs Python's 5 ms
timeout 230 python3 -m benchmarks.ditto_bench --size 1080x1920 --skip-reference --variants compile+cudagraph --repeat 5 --mp4 ultrafast:8/8/2,ultrafast:8/8/2@0.5,ultrafast:6/8/2,ultrafast:6/8/2@0.5,ultrafast:4/8/3,ultrafast:16/16/4 --json $OUT/ditto_mp4.json > $OUT/ditto_mp4.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/ditto_mp4.log | grep -i "mp4\|dense fps\|first frame" | tail -12
date -u
# 2: Ditto's render runner per batch size (live batches of ~6-13 frames vs the dense 32)
timeout 160 python3 -m benchmarks.bucket_timing --engine ditto --accel compile+cudagraph --sizes 4,8,12,16,32 --json $OUT/bucket_ditto.json > $OUT/bucket_ditto.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/bucket_ditto.log | tail -12
date -u
