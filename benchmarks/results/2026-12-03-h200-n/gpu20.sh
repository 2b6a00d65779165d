. .carry/setup.sh
set -o pipefail
date -u
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_streams.py tests/test_accel.py tests/test_batching.py -k "cuda or own_stream or stream" 2>&1 | tail -15
date -u
timeout 330 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 8,10,12 --render-aheads 4,8 --cuda-streams sessions --json $OUT/load_musetalk_sessions.json > $OUT/load_musetalk_sessions.log 2>&1; echo rc=$?
grep -v "^WARNING: MuseTalk is using" $OUT/load_musetalk_sessions.log | grep -v "prebake" | tail -14
date -u
