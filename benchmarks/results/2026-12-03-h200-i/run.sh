. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
LT="--engine musetalk --weights random --fps 30 --size 1080 --duration 15 --accel compile+cudagraph --client-processes 4"
# 1: sync call sites (warm-up ones included), 10 sessions
timeout 210 python3 .carry/sync_debug_load.py $LT --sessions 10 --json $OUT/load_sync.json > $OUT/load_sync.log 2>&1; echo rc=$?
grep -v "^WARNING: MuseTalk is using" $OUT/load_sync.log | grep -v prebake | tail -6
grep -c "^SYNC" $OUT/load_sync.log
date -u
# 2: who holds the GIL (py-spy as the parent process), 10 sessions
timeout 170 py-spy record --nonblocking --gil --threads -r 100 -f raw -o $OUT/spy_gil.txt -- python3 -m benchmarks.load_test $LT --sessions 10 --json $OUT/load_gil.json > $OUT/load_gil.log 2>&1; echo rc=$?
tail -4 $OUT/load_gil.log
date -u
# 3: every thread incl. waiting ones, native frames
timeout 170 py-spy record --nonblocking --idle --native --threads -r 25 -f raw -o $OUT/spy_idle.txt -- python3 -m benchmarks.load_test $LT --sessions 10 --json $OUT/load_idle.json > $OUT/load_idle.log 2>&1; echo rc=$?
tail -4 $OUT/load_idle.log
ls -la $OUT
date -u
