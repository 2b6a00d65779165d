# Thirty-sixth session, call 1a (cold): the thirty-fifth session's CPU-only capture fixes on a GPU, and the host's speed
# (the first half of the call first planned; the pool's refusals left too little device time for both halves in one call; the other is call1b.sh).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
python -m benchmarks.host_speed
timeout 90 python -m benchmarks.capture_probe --captures 30 2>&1 | grep -v Warn | tee $OUT/capture_probe.jsonl
timeout 90 python -m pytest -q tests/test_accel.py tests/test_stream_contract.py -k "cuda or capture or compose or freed" \
  -p no:cacheprovider 2>&1 | grep -v Warn > $OUT/capture_tests.log; grep -E "^E  |passed|failed" $OUT/capture_tests.log | head -12
for k in 1 2; do
  timeout 40 python -m pytest -q tests/test_accel.py -k "capture_mid_stream_survives" -p no:cacheprovider 2>&1 | tail -1
done
echo "checks done at $SECONDS s"
