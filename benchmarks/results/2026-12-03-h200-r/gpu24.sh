. .carry/setup.sh
set -o pipefail
date -u
timeout 200 python3 -m benchmarks.load_test --engine ditto --fps 25 --weights random --size 1080 --duration 12 --accel compile+cudagraph --client-processes 4 --sessions 8 --render-aheads 4,8 --render-in-flight 0,2 --json $OUT/load_ditto_inflight.json > $OUT/load_ditto_inflight.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/load_ditto_inflight.log | grep -v "prebake" | tail -16
date -u
timeout 340 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 8,9,10 --render-aheads 8 --render-in-flight 1,2 --json $OUT/load_musetalk_inflight.json > $OUT/load_musetalk_inflight.log 2>&1; echo rc=$?
grep -v "^WARNING: MuseTalk is using" $OUT/load_musetalk_inflight.log | grep -v "prebake" | tail -12
date -u
