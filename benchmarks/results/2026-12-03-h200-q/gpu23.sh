. .carry/setup.sh
set -o pipefail
date -u
NEWSSTUDIO_MEDIA_DIR=.carry/media timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_batching.py tests/test_accel.py -k "cuda or stream or bound" 2>&1 | tail -15
date -u
timeout 400 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 8,9 --render-aheads 4,8 --render-in-flight 0,1,2 --json $OUT/load_musetalk_inflight.json > $OUT/load_musetalk_inflight.log 2>&1; echo rc=$?
grep -v "^WARNING: MuseTalk is using" $OUT/load_musetalk_inflight.log | grep -v "prebake" | tail -40
date -u
