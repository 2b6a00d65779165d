# Thirty-fifth session, call 5: what breaks a thread-local capture beside busy threads (benchmarks/capture_probe.py),
# whether random draws work after a failed capture (the fix in accel/graph_capture.py), and the CUDA capture tests.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 100 python -m benchmarks.capture_probe --captures 40 2>&1 | grep -v Warn | tee $OUT/capture_probe.jsonl
timeout 90 python -m pytest -q tests/test_accel.py tests/test_stream_contract.py -k "cuda or capture or compose or freed" \
  -p no:cacheprovider 2>&1 | grep -v Warn > $OUT/capture_tests.log; grep -E "^E  |passed|failed" $OUT/capture_tests.log | head -12
echo "done at $SECONDS s"
