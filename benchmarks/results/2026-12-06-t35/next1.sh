# For the next GPU session's first call (cold; ~560 s): (1) the host's speed; (2) the thirty-fifth session's
# CPU-only capture fixes: a random draw works after a failed capture, which waits in other threads break a
# thread-local capture (benchmarks/capture_probe.py), the CUDA capture tests (the mid-stream one three more times);
# (3) 16 MuseTalk sessions at the 30 s levels, twice, with the defaults and the many-streams settings.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
python -m benchmarks.host_speed
timeout 90 python -m benchmarks.capture_probe --captures 30 2>&1 | grep -v Warn | tee $OUT/capture_probe.jsonl
timeout 90 python -m pytest -q tests/test_accel.py tests/test_stream_contract.py -k "cuda or capture or compose or freed" \
  -p no:cacheprovider 2>&1 | grep -v Warn > $OUT/capture_tests.log; grep -E "^E  |passed|failed" $OUT/capture_tests.log | head -12
for k in 1 2 3; do
  timeout 40 python -m pytest -q tests/test_accel.py -k "capture_mid_stream_survives" -p no:cacheprovider 2>&1 | tail -1
done
echo "checks done at $SECONDS s"
timeout -s ABRT ${LM:-400} python -X faulthandler -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --chunk-frames 4 --warm-up-s 5 --duration 30 --sessions 16,16 --fill-render-batches on \
  --json $OUT/load_musetalk30s.json > $OUT/load_musetalk30s.log 2>&1; echo "rc $?"
grep "ready after" $OUT/load_musetalk30s.log
python -m benchmarks.load_summary $OUT/load_musetalk30s.json
echo "done at $SECONDS s"
