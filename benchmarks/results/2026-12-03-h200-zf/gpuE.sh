. .carry/setup.sh
set -o pipefail
date -u
# MuseTalk at 30 fps, render ahead 8: render lead 0 (as before) vs 150 ms with chunks sent on the media clock, 8/10/12 sessions
timeout 470 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 30 --accel compile+cudagraph --client-processes 4 --sessions 8,10,12 --render-aheads 8 --render-leads 0,0.15 --send-on-clock on --warm-up-s 10 --json $OUT/load_musetalk30p.json > $OUT/load_musetalk30p.log 2>&1; echo rc=$?
grep -v "prebake" $OUT/load_musetalk30p.log | cut -c1-330 | tail -22
date -u
