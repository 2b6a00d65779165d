. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# MuseTalk 30 fps (run ZM's settings), compose on the session's stream vs the side stream: levels 1-2 with a 3 s
# profiler window (GPU busy, CUDA runtime calls of every thread), levels 3-6 unobserved but for py-spy dumps in 3-4
(timeout 470 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 12,12,16 --render-aheads 8 --render-leads 0.25 --send-on-clock on --live-update-rows 10 --compose session,stream --profile-s 3 --profile-levels 1,2 --warm-up-s 5 --json $OUT/load.json > $OUT/load.log 2>&1; echo rc=$? >> $OUT/load.log) &
LT=$!
sleep 10
PID=$(pgrep -o -f "^python3 -m benchmarks.load_test")
for n in 3 4; do
  for i in $(seq 1 400); do [ "$(grep -c 'level of 1. sessions starts' $OUT/load.log 2>/dev/null)" -ge $n ] && break; kill -0 $LT 2>/dev/null || break; sleep 1; done
  for d in 1 2 3; do sleep 3; timeout 20 py-spy dump --pid $PID > $OUT/dump_${n}_$d.txt 2>&1; done
done
wait $LT
grep -v "prebake" $OUT/load.log | grep "^\[\|rc=" | tail -8
grep -A40 "GPU busy" $OUT/load.log | grep -v "^ *[0-9.]* ms *[0-9]*x  \(void\|sm90\|triton\|at::\|cutlass\|std::\|nvjet\|Memcpy\|Memset\)" | grep -v "^sessions\|^ *1[26] |" | head -70
python3 -c "
import json
for r in json.load(open('$OUT/load.json')):
    print({k: (round(r[k], 2) if isinstance(r.get(k), float) else r.get(k)) for k in ('sessions', 'compose', 'sustained', 'fps_median', 'server_fps', 'jitter_p95_ms', 'loop_lag_p95_ms', 'batch_frames_mean', 'skipped_frames_per_session', 'render_busy_share', 'render_wait_ms_mean', 'session_render_call_ms', 'session_render_wait_ms', 'session_copy_out_ms')})
"
python3 - <<PY
import collections, glob, re
for n in (3, 4):
    where = collections.Counter()
    for f in sorted(glob.glob('$OUT/dump_%d_*.txt' % n)):
        for block in open(f).read().split('\nThread ')[1:]:
            head, *frames = block.strip().splitlines()
            if 'newsstudio-live' not in head:
                continue
            frames = [x.strip() for x in frames if x.strip()]
            own = [i for i, x in enumerate(frames) if 'newsstudio/' in x]
            k = own[0] if own else 0
            where[' < '.join(x.split(' (')[0] + ':' + x.rsplit(':', 1)[-1].rstrip(')') for x in frames[max(0, k - 2):k + 1])] += 1
    print('level', n, 'session threads (newsstudio-live) in 3 dumps:')
    for w, c in where.most_common(12):
        print('  ', c, w)
PY
cd $OUT && tar czf zs.tgz load.json load.log dump_*.txt && rm -f dump_*.txt
date -u
