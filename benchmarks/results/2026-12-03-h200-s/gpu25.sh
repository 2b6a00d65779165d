. .carry/setup.sh
set -o pipefail
date -u
timeout 185 python3 -m benchmarks.load_test --engine ditto --fps 25 --weights random --size 1080 --duration 12 --accel compile+cudagraph --client-processes 4 --sessions 6 --render-in-flight 2,0 --json $OUT/load_ditto_default.json > $OUT/load_ditto_default.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/load_ditto_default.log | grep -v "prebake" | tail -8
date -u
