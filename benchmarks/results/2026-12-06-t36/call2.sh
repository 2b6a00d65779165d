# Thirty-sixth session, call 2 (warm after call 1): the Ditto stream goal with 30 s levels (8 sessions twice).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout -s ABRT ${LD:-230} python -X faulthandler -m benchmarks.load_test --engine ditto --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 8 --render-leads 0.15 --send-on-clock on \
  --warm-up-s 5 --duration 30 --sessions 8,8 --json $OUT/load_ditto30s.json > $OUT/load_ditto30s.log 2>&1; echo "rc $?"
python -m benchmarks.load_summary $OUT/load_ditto30s.json
echo "done at $SECONDS s"
