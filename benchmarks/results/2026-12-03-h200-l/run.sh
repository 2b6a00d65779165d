. .carry/setup.sh
set -o pipefail
date -u
timeout 165 python3 -m benchmarks.load_test --engine ditto --fps 25 --weights random --size 1080 --duration 12 --accel compile+cudagraph --client-processes 4 --sessions 6,8 --render-leads 0,0.1 --json $OUT/load_ditto.json 2>&1 | grep -v "^WARNING: Ditto is using" | grep -v "prebake" | tee $OUT/load_ditto.log | tail -8
date -u
