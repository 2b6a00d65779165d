. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# 1: the graph-family fix (two networks' graphs at once on two streams) and the batcher tests, on a GPU
NEWSSTUDIO_MEDIA_DIR=.carry/media timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_accel.py tests/test_batching.py -k "cuda or stream or bound or switched or lmdm_windows or stalled or tf32" 2>&1 | tail -30
date -u
# 2: Ditto with front-end streams (runs T, U: the motion batch never finished; speaking share fell to 0)
(timeout 230 python3 -m benchmarks.load_test --engine ditto --fps 25 --weights random --size 1080 --duration 12 --accel compile+cudagraph --client-processes 4 --sessions 8 --warm-up-s 8 --front-end-streams off,on,off,on --json $OUT/load_ditto_fes.json > $OUT/load_ditto_fes.log 2>&1; echo rc=$? >> $OUT/load_ditto_fes.log) &
for i in $(seq 1 220); do grep -q "starts (.*front-end streams on)" $OUT/load_ditto_fes.log 2>/dev/null && break; sleep 1; done
sleep 9
PID=$(pgrep -o -f "^python3 -m benchmarks.load_test")
echo "dump pid $PID at $(date -u +%T)"
[ -n "$PID" ] && timeout 30 py-spy dump --pid $PID > $OUT/stacks_on.txt 2>&1; echo "py-spy rc=$?"
wait
grep -v "^WARNING: Ditto is using" $OUT/load_ditto_fes.log | grep -v "prebake" | tail -14
date -u
