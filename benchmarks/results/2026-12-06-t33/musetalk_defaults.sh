# Live MuseTalk sessions with the server's defaults (batch and compose graphs on, 100 ms feature step, 2 batches in
# flight) and the many-streams settings; SESSIONS, EXTRA (more load_test flags), NAME (output name) from the caller.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
NAME=${NAME:-load_defaults}
timeout -s ABRT ${LB:-300} python -X faulthandler -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions ${SESSIONS:-16,20} --fill-render-batches on $EXTRA \
  --json $OUT/$NAME.json > $OUT/$NAME.log 2>&1; echo "rc $?"
grep -v Warn $OUT/$NAME.log | grep "^\[\|Fatal\|Error" | grep -v starts | tail -5
python -m benchmarks.load_summary $OUT/$NAME.json
echo "done at $SECONDS s"
