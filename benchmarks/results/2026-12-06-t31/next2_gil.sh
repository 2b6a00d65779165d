# For the next GPU session, after next1.sh on the same warm machine (~300 s): who holds the GIL at 16 MuseTalk sessions.
# Every thread waits ~1.1 ms (median) for the GIL after each torch call at 16 sessions (thirty-first session), so the
# question is which threads hold it: py-spy --gil (100 Hz, 5 s mid-level) in a level with the batch graphs and one
# without. Carry: the py-spy wheel in .whl (python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
# --platform manylinux1_x86_64 -d .whl py-spy) and, to stay under 64 MiB, .carry/media moved aside for this call
# (the load test's astronaut avatar needs only .carry/astronaut.faces.npz). Set IN_FLIGHT to next1.sh's better value.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
IN_FLIGHT=${IN_FLIGHT:-1}
(timeout 280 python -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 \
  --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16 --fill-render-batches on \
  --render-in-flight $IN_FLIGHT --batch-graphs on,off --json $OUT/load_gil.json > $OUT/load_gil.log 2>&1; echo rc=$? >> $OUT/load_gil.log) &
LT=$!
sleep 10
PID=$(pgrep -o -f "^python -m benchmarks.load_test")
echo "server pid $PID"
for n in 1 2; do
  for i in $(seq 1 300); do [ "$(grep -c 'level of 16 sessions starts' $OUT/load_gil.log 2>/dev/null)" -ge $n ] && break; kill -0 $LT 2>/dev/null || break; sleep 1; done
  kill -0 $LT 2>/dev/null || break
  sleep 8
  py-spy record --pid $PID --nonblocking --threads --gil -r 100 -d 5 -f raw -o $OUT/gil_$n.txt > /dev/null 2>&1 & G=$!
  py-spy record --pid $PID --nonblocking --threads -r 100 -d 5 -f raw -o $OUT/active_$n.txt > /dev/null 2>&1 & A=$!
  wait $G $A
done
wait $LT
grep "^\[\|rc=" $OUT/load_gil.log | tail -6
for n in 1 2; do
  echo "=== level $n"
  python -m benchmarks.pyspy_summary $OUT/gil_$n.txt $OUT/active_$n.txt --seconds 5 --threads render-batcher,live,speech,asyncio,MainThread --depth 2 2>&1 | head -60
done
