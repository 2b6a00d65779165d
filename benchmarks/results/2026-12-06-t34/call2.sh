# Thirty-fourth session, call 2 (H100, cold): the GPU test that failed in call 1, with its message; then the issue's
# stream goal with 30 s levels (16 MuseTalk twice with the defaults and many-streams settings, 8 Ditto twice).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 90 python -m pytest -q -x tests/test_accel.py -k "capture_mid_stream_survives" -p no:cacheprovider 2>&1 | grep -v Warn | tail -30
echo "test done at $SECONDS s"
timeout -s ABRT 300 python -X faulthandler -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --chunk-frames 4 --warm-up-s 5 --duration 30 --sessions 16,16 --fill-render-batches on \
  --json $OUT/load_musetalk30s.json > $OUT/load_musetalk30s.log 2>&1; echo "rc $?"
python -m benchmarks.load_summary $OUT/load_musetalk30s.json
echo "musetalk done at $SECONDS s"
timeout -s ABRT $((590 - SECONDS)) python -X faulthandler -m benchmarks.load_test --engine ditto --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 8 --render-leads 0.15 --send-on-clock on \
  --warm-up-s 5 --duration 30 --sessions 8,8 --json $OUT/load_ditto30s.json > $OUT/load_ditto30s.log 2>&1; echo "rc $?"
python -m benchmarks.load_summary $OUT/load_ditto30s.json
echo "done at $SECONDS s"
