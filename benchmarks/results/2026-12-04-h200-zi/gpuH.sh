. .carry/setup.sh
set -o pipefail
date -u
# MuseTalk at 30 fps, render ahead 8, lead 150 ms, render window 4 ms: phase slots off vs 3 (sessions' clocks on a shared grid), 10/12/16 sessions
timeout 520 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 30 --accel compile+cudagraph --client-processes 4 --sessions 10,12,16 --render-aheads 8 --render-leads 0.15 --send-on-clock on --phase-slots 0,3 --render-windows-ms 4 --warm-up-s 10 --json $OUT/load_musetalk30q.json > $OUT/load_musetalk30q.log 2>&1; echo rc=$?
grep -v "prebake" $OUT/load_musetalk30q.log | cut -c1-420 | tail -22
date -u
