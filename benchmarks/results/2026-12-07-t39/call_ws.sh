# Thirty-ninth session: 16 MuseTalk sessions at the 30 s levels (the many-streams settings of
# 2026-12-06-t36/call1b.sh), WebSocket chunks written to the socket without the GIL (on) or all through
# uvloop's transport (off, the code before): levels on,off,on (WS=...) on one server; py-spy --gil samples
# the server's threads for 12 s in levels 2 (off) and 3 (on), both after the cold first level.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
python -c "import asyncio, uvicorn, sys; import importlib.util as u; print('python', sys.version.split()[0], 'uvloop', bool(u.find_spec('uvloop')), 'uvicorn', uvicorn.__version__)"
timeout -s ABRT ${LM:-420} python -X faulthandler -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --chunk-frames 4 --warm-up-s 5 --duration 30 --sessions 16 --ws-socket-writes ${WS:-on,off,on} --fill-render-batches on \
  --json $OUT/load_ws.json > $OUT/load_ws.log 2>&1 &
TPID=$!
( for lev in ${PLEV:-2 3}; do
    for i in $(seq 1 ${LM:-420}); do
      [ "$(grep -c 'level of 16 sessions starts' $OUT/load_ws.log 2>/dev/null)" -ge $lev ] && break; sleep 1; done
    sleep 8; SPID=$(pgrep -P $TPID | head -1); echo "py-spy level $lev on $SPID at $SECONDS s"
    py-spy record --nonblocking --threads --gil -r 100 -d 12 -f raw -o $OUT/gil_$lev.txt --pid $SPID > /dev/null 2>&1
    python -m benchmarks.pyspy_summary $OUT/gil_$lev.txt --rate 100 --seconds 12 \
      --threads newsstudio-live,newsstudio-speech,Thread-1,musetalk-whisper,render-batcher --depth 2 > $OUT/gil_${lev}_summary.txt 2>&1
  done
) &
wait $TPID; echo "rc $?"; wait
grep "ready after\|level of" $OUT/load_ws.log
python -m benchmarks.load_summary $OUT/load_ws.json
for lev in ${PLEV:-2 3}; do echo "== level $lev"; head -24 $OUT/gil_${lev}_summary.txt; done
echo "done at $SECONDS s"
