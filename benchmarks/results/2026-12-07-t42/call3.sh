# forty-second session, call 3 (same warm host): MuseTalk's dense stages, the front end ahead vs inline (compiled defaults)
source .carry/setup.sh; timeout 430 python -m benchmarks.dense_stages --engine musetalk --accel compile+cudagraph --json $OUT/dense_stages_musetalk.json > $OUT/dense_stages_musetalk.log 2>&1; echo "rc $?"; grep -v -i warn $OUT/dense_stages_musetalk.log | tail -30
