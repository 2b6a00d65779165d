# Thirty-fourth session, call 2 (cold): the GPU test that failed in call 1, with its message (twice: flaky or not?);
# then the MuseTalk stream goal with 30 s levels (16 sessions twice, the defaults and many-streams settings)
# on f6fb91a (closed sessions leave no reference cycles: each level's gpu_before_mb should no longer grow).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
for k in 1 2; do
  timeout 60 python -m pytest -q -x tests/test_accel.py -k "capture_mid_stream_survives" -p no:cacheprovider 2>&1 \
    | grep -v Warn | grep -E "^E |Error|passed|failed" | head -12
done
echo "tests done at $SECONDS s"
timeout -s ABRT ${LM:-330} python -X faulthandler -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --chunk-frames 4 --warm-up-s 5 --duration 30 --sessions 16,16 --fill-render-batches on \
  --json $OUT/load_musetalk30s.json > $OUT/load_musetalk30s.log 2>&1; echo "rc $?"
python -m benchmarks.load_summary $OUT/load_musetalk30s.json
python -c "import json,os; [print('level', i + 1, 'gpu MB before/peak/after', round(r['gpu_before_mb']), round(r['gpu_peak_mb']), round(r['gpu_after_mb']), 'late_max_ms', r['late_max_ms'], 'loop_lag_max_ms', r['loop_lag_max_ms']) for i, r in enumerate(json.load(open(os.environ['OUT'] + '/load_musetalk30s.json')))]"
echo "done at $SECONDS s"
