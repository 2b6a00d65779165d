# call 2: 16 and 20 live MuseTalk sessions at the default MuseTalk feature step (100 ms = 5 rows of 20 ms), both graph
# families on vs batch graphs off (call 1 measured the 200 ms step: 16 of 16 in all four combinations).
# call 3 is this script with SESSIONS=20,24 BATCH_GRAPHS=on NAME=load_step100_b (call3.sh).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
NAME=${NAME:-load_step100}
timeout -s ABRT ${L:-540} python -X faulthandler -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 5 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions ${SESSIONS:-16,20} --fill-render-batches on \
  --render-in-flight 2 --batch-graphs ${BATCH_GRAPHS:-on,off} --compose-graphs on \
  --json $OUT/$NAME.json > $OUT/$NAME.log 2>&1; echo "rc $?"
grep -v Warn $OUT/$NAME.log | grep "^\[\|Fatal\|Error" | grep -v starts | tail -8
python -m benchmarks.load_summary $OUT/$NAME.json
echo "done at $SECONDS s"
