. .carry/setup.sh
set -o pipefail
date -u
LT="--weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --profile-s 3"
timeout 290 python3 -m benchmarks.load_test --engine musetalk --fps 30 $LT --sessions 8,10,12 --json $OUT/load_musetalk.json > $OUT/load_musetalk.log 2>&1; echo rc=$?
grep -v "^WARNING: MuseTalk is using" $OUT/load_musetalk.log | grep -v "prebake\|USDT\|External init\|_warn_once\|Profiler clears" | tail -75
date -u
timeout 170 python3 -m benchmarks.load_test --engine ditto --fps 25 $LT --sessions 5,6,8 --json $OUT/load_ditto.json > $OUT/load_ditto.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/load_ditto.log | grep -v "prebake\|USDT\|External init\|_warn_once\|Profiler clears" | tail -75
date -u
timeout 100 python3 -m benchmarks.load_test --engine ditto --fps 25 --weights random --size 1080 --duration 12 --accel compile+cudagraph --client-processes 4 --sessions 6 --sync-debug > $OUT/sync_ditto.log 2>&1; echo rc=$?
grep -c "^sync x" $OUT/sync_ditto.log
date -u
