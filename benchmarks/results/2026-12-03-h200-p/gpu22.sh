. .carry/setup.sh
set -o pipefail
date -u
timeout 235 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 8,9 --render-aheads 8 --json $OUT/load_musetalk_ahead8.json > $OUT/load_musetalk_ahead8.log 2>&1; echo rc=$?
grep -v "^WARNING: MuseTalk is using" $OUT/load_musetalk_ahead8.log | grep -v "prebake" | tail -6
date -u
