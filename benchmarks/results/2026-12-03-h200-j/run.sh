. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
LT="--engine musetalk --weights random --fps 30 --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4"
timeout 300 python3 -m benchmarks.load_test $LT --sessions 8,12 --profile-s 3 --json $OUT/load_prof.json > $OUT/load_prof.log 2>&1; echo rc=$?
grep -v "^WARNING: MuseTalk is using" $OUT/load_prof.log | grep -v "prebake\|USDT\|External init" | tail -70
date -u
timeout 170 py-spy record --idle --native --threads -r 20 -f raw -o $OUT/spy_idle.txt -- python3 -m benchmarks.load_test $LT --sessions 10 --json $OUT/load_idle.json > $OUT/load_idle.log 2>&1; echo rc=$?
tail -3 $OUT/load_idle.log
date -u
