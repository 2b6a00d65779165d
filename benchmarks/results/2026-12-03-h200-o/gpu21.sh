. .carry/setup.sh
set -o pipefail
date -u
timeout 280 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 8,10 --render-aheads 4,8 --json $OUT/load_musetalk_aheads.json > $OUT/load_musetalk_aheads.log 2>&1; echo rc=$?
grep -v "^WARNING: MuseTalk is using" $OUT/load_musetalk_aheads.log | grep -v "prebake" | tail -10
date -u
timeout 200 python3 -m benchmarks.load_test --engine ditto --fps 25 --weights random --size 1080 --duration 12 --accel compile+cudagraph --client-processes 4 --sessions 8 --render-aheads 4,8 --json $OUT/load_ditto_aheads.json > $OUT/load_ditto_aheads.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/load_ditto_aheads.log | grep -v "prebake" | tail -6
date -u
