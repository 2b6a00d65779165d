. .carry/setup.sh
set -o pipefail
date -u
timeout 280 python3 -m benchmarks.load_test --engine musetalk --weights random --fps 30 --size 1080 --sessions 8,10,12 --duration 20 --accel compile+cudagraph --client-processes 4 --json $OUT/load_musetalk.json 2>&1 | tee $OUT/load_musetalk.log | grep -v "^WARNING: MuseTalk is using" | grep -v prebake | tail -8
date -u
timeout 160 python3 -m benchmarks.load_test --engine ditto --weights random --fps 25 --size 1080 --sessions 5,6 --duration 20 --accel compile+cudagraph --client-processes 4 --json $OUT/load_ditto.json 2>&1 | tee $OUT/load_ditto.log | grep -v "^WARNING: Ditto is using" | grep -v prebake | tail -8
date -u
timeout 110 python3 -m benchmarks.conv_profile --engine musetalk --rows 24 2>&1 | tee $OUT/conv_musetalk.log | tail -60
date -u
