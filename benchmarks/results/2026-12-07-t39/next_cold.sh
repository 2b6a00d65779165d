# For the next GPU session (cold, ~200 s): Ditto's cold first level (thirty-ninth session: 0 of 8 in a fresh server's
# first 30 s level, 8 of 8 in the second; render calls 2.4x longer, +841 MB of GPU memory that stayed). Three 8-session
# levels with /metrics' compile_work tallied per level (graph captures, torch.compile frames): if the first level
# captures or compiles more than the later ones, that names the work the warm-up missed.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout -s ABRT ${LD:-260} python -X faulthandler -m benchmarks.load_test --engine ditto --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 8 --render-leads 0.15 --send-on-clock on \
  --warm-up-s 5 --duration 30 --sessions 8,8,8 --json $OUT/load_ditto_cold.json > $OUT/load_ditto_cold.log 2>&1; echo "rc $?"
python -m benchmarks.load_summary $OUT/load_ditto_cold.json
echo "done at $SECONDS s"
