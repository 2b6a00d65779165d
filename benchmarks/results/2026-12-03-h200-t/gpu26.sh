. .carry/setup.sh
set -o pipefail
date -u
NEWSSTUDIO_MEDIA_DIR=.carry/media timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_batching.py -k "switched or own_stream or bound" 2>&1 | tail -5
date -u
timeout 200 python3 -m benchmarks.load_test --engine ditto --fps 25 --weights random --size 1080 --duration 12 --accel compile+cudagraph --client-processes 4 --sessions 8 --render-aheads 4,8 --front-end-streams off,on --json $OUT/load_ditto_fes.json > $OUT/load_ditto_fes.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/load_ditto_fes.log | grep -v "prebake" | tail -12
date -u
timeout 285 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 8 --render-aheads 8 --front-end-streams off,on --json $OUT/load_musetalk_fes.json > $OUT/load_musetalk_fes.log 2>&1; echo rc=$?
grep -v "^WARNING: MuseTalk is using" $OUT/load_musetalk_fes.log | grep -v "prebake" | tail -12
date -u
