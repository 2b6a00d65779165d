# For the next GPU session's first call (cold, ~500 s with LM=420): (1) the host's speed (benchmarks/host_speed.py:
# the thirty-fourth session's slow host ran a 5 M-step loop in 0.77 s and launched a kernel in 13.5 us); (2) the GPU
# tests of this session's CPU-only changes (a failed compose capture composes eagerly; closed sessions free their GPU
# memory) and the capture test that failed once (three runs, its message kept); (3) 16 MuseTalk sessions, 30 s levels,
# twice, with the defaults, each with speech pushed as it comes and at most every 100 ms (--speech-push-intervals-ms
# 0,100; each level's line has late max, loop lag, GPU memory before/after and the host's speed).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
grep -m1 "model name" /proc/cpuinfo; nproc; cat /proc/loadavg
python -m benchmarks.host_speed
python3 -c "
import time
t=time.perf_counter(); s=0
for i in range(5_000_000): s+=i*i
print('5M-step loop s', round(time.perf_counter()-t,3))"
timeout 120 python -m pytest -q tests/test_accel.py tests/test_stream_contract.py -k "cuda or capture or compose or freed" \
  -p no:cacheprovider 2>&1 | grep -v Warn | grep -E "^E |Error|passed|failed" | head -20
for k in 1 2; do
  timeout 60 python -m pytest -q -x tests/test_accel.py -k "capture_mid_stream_survives" -p no:cacheprovider 2>&1 \
    | grep -v Warn | grep -E "^E |Error|passed|failed" | head -12
done
echo "checks done at $SECONDS s"
timeout -s ABRT ${LM:-420} python -X faulthandler -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --chunk-frames 4 --warm-up-s 5 --duration 30 --sessions 16,16 --fill-render-batches on --speech-push-intervals-ms 0,100 \
  --json $OUT/load_musetalk30s.json > $OUT/load_musetalk30s.log 2>&1; echo "rc $?"
grep "ready after" $OUT/load_musetalk30s.log
python -m benchmarks.load_summary $OUT/load_musetalk30s.json
echo "done at $SECONDS s"
