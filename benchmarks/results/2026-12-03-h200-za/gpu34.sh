. .carry/setup.sh
set -o pipefail
date -u
# 1: MuseTalk, front-end streams on from the start, three 30 s levels of 8 (run Z: on 8/8, off 0/8, then on 0/8 with
# renders 4x slower: does a server that never switches also degrade over time?)
timeout 290 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 30 --accel compile+cudagraph --client-processes 4 --sessions 8,8,8 --render-aheads 8 --warm-up-s 10 --front-end-streams on --json $OUT/load_musetalk_on.json > $OUT/load_musetalk_on.log 2>&1; echo rc=$?
grep -v "^WARNING: MuseTalk is using" $OUT/load_musetalk_on.log | grep -v "prebake" | tail -8
date -u
# 2: Ditto dense with and without the TF32 front end (one process); avatar open with the mmap packet reader
timeout 210 python3 -m benchmarks.ditto_bench --size 1080x1920 --skip-reference --variants compile+cudagraph,compile+cudagraph:tf32 --mp4 ultrafast:8/8/2 --json $OUT/ditto.json > $OUT/ditto.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/ditto.log | tail -24
date -u
