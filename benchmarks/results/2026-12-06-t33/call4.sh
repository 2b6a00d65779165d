# call 4 (cold): (A) 8 live Ditto sessions with the live compose graphs on and off (their first Ditto level: the
# default is on for every engine that replays CUDA graphs); (B) the new defaults end to end: 16 and 20 MuseTalk
# sessions with no graph flags (musetalk_defaults.sh).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout -s ABRT ${LA:-260} python -X faulthandler -m benchmarks.load_test --engine ditto --fps 30 --weights random \
  --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 8 --render-aheads 8 \
  --render-leads 0.15 --send-on-clock on --warm-up-s 5 --compose-graphs on,off \
  --json $OUT/load_ditto8.json > $OUT/load_ditto8.log 2>&1; echo "rc $?"
grep -v Warn $OUT/load_ditto8.log | grep "^\[\|Fatal\|Error" | grep -v starts | tail -5
python -m benchmarks.load_summary $OUT/load_ditto8.json
echo "A done at $SECONDS s"
SESSIONS=16,20 NAME=load_defaults bash benchmarks/results/2026-12-06-t33/musetalk_defaults.sh
