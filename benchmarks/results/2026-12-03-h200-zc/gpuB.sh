. .carry/setup.sh
set -o pipefail
date -u
# 1: Ditto live at 30 fps, 8 sessions (run A: 205.6 then 239.2 frames/s, jitter p95 298 then 125 ms, 0 of 8 sustained):
# render-ahead 4 (default) and 8, render lead 0 and 100 ms, one 30 s level each after a warm-up
timeout 265 python3 -m benchmarks.load_test --engine ditto --fps 30 --weights random --size 1080 --duration 30 --accel compile+cudagraph --client-processes 4 --sessions 8 --render-aheads 4,8 --render-leads 0,0.1 --warm-up-s 8 --json $OUT/load_ditto30b.json > $OUT/load_ditto30b.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/load_ditto30b.log | grep -v prebake | tail -14
date -u
# 2: Ditto dense, TTFF, MP4 on this tree; then its packet's open (the avatar-open goal, 1 ms; 1.24 ms in the fourth session)
timeout 200 python3 -m benchmarks.ditto_bench --size 1080x1920 --skip-reference --variants compile+cudagraph --mp4 ultrafast:8/8/2 --workdir /tmp/dw --json $OUT/ditto.json > $OUT/ditto.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/ditto.log | tail -20
ls /tmp/dw/avatars/yongen | head -40 | tr '\n' ' '; echo
timeout 40 python3 -m benchmarks.cold_start --packet /tmp/dw/avatars/yongen --repeat 1000 --json $OUT/open_ditto.json 2>&1 | tail -8
date -u
