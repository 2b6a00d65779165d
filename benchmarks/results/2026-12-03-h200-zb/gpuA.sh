. .carry/setup.sh
set -o pipefail
date -u
# 1: MuseTalk 6.6 s segment -> MP4 with frames handed to x264 in place (0.69 s before; goal 0.6 s), dense fps, TTFF
timeout 250 python3 -m benchmarks.musetalk_bench --size 1080x1920 --skip-reference --variants compile+cudagraph --mp4 ultrafast:8/8/2,ultrafast:16/16/4 --repeat 3 --json $OUT/musetalk.json > $OUT/musetalk.log 2>&1; echo rc=$?
grep -v "^WARNING: MuseTalk is using" $OUT/musetalk.log | tail -24
date -u
# 2: the encoder alone on the same configurations (frames owned, as the product hands them over)
timeout 50 python3 -m benchmarks.encode_bench --size 1080x1920 --configs ultrafast:8/8/2,ultrafast:16/16/4 --repeat 3 --json $OUT/encode.json > $OUT/encode.log 2>&1; echo rc=$?
tail -8 $OUT/encode.log
date -u
# 3: Ditto live at 30 fps (the goal's rate; motion resampled per output frame), two 30 s levels of 8
timeout 235 python3 -m benchmarks.load_test --engine ditto --fps 30 --weights random --size 1080 --duration 30 --accel compile+cudagraph --client-processes 4 --sessions 8,8 --warm-up-s 6 --json $OUT/load_ditto30.json > $OUT/load_ditto30.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/load_ditto30.log | grep -v prebake | tail -12
date -u
