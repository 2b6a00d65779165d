. .carry/setup.sh
set -o pipefail
date -u
# MuseTalk at 8 sessions, render-ahead 8, 30 s levels, front-end streams on/off/on after a warm-up level
# (run T's off level was the server's first; Ditto, run X: off 2/8 then 8/8, on 8/8 twice with lower jitter)
timeout 360 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 30 --accel compile+cudagraph --client-processes 4 --sessions 8 --render-aheads 8 --warm-up-s 10 --front-end-streams on,off,on --json $OUT/load_musetalk_fes.json > $OUT/load_musetalk_fes.log 2>&1; echo rc=$?
grep -v "^WARNING: MuseTalk is using" $OUT/load_musetalk_fes.log | grep -v "prebake" | tail -12
date -u
