. .carry/setup.sh
set -o pipefail
date -u
# Ditto at 30 fps, 8 sessions, render ahead 8: chunks sent on the media clock (new) vs when ready, render leads 150 / 250 ms
timeout 470 python3 -m benchmarks.load_test --engine ditto --fps 30 --weights random --size 1080 --duration 30 --accel compile+cudagraph --client-processes 4 --sessions 8,8 --render-aheads 8 --render-leads 0.15,0.25 --send-on-clock on,off --warm-up-s 8 --json $OUT/load_ditto30c.json > $OUT/load_ditto30c.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using\|prebake" $OUT/load_ditto30c.log | cut -c1-330 | tail -22
date -u
