# Thirty-sixth session, call 1 as first planned (cold; ~560 s). Never ran: the pool refused every start until too little device time was left; its halves are call1a.sh and call1b.sh.
# It was to check (1) the host's speed; (2) the thirty-fifth session's CPU-only capture fixes: a random draw works after a failed capture, which waits in other threads break a thread-local capture
# (benchmarks/capture_probe.py), the CUDA capture tests (the mid-stream one three more times); (3) 16 MuseTalk sessions
# at the 30 s levels, twice, with the many-streams settings; py-spy (--gil, non-blocking) samples the server's
# threads for 15 s in the second level: who holds the GIL, and where.
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
  --json $OUT/load_musetalk30s.json > $OUT/load_musetalk30s.log 2>&1 &
TPID=$!
( for i in $(seq 1 ${LM:-400}); do
    [ "$(grep -c 'level of 16 sessions starts' $OUT/load_musetalk30s.log 2>/dev/null)" -ge 2 ] && break; sleep 1; done
  sleep 6; SPID=$(pgrep -P $TPID | head -1); echo "py-spy on $SPID at $SECONDS s"
  py-spy record --nonblocking --threads --gil -r 100 -d 15 -f raw -o $OUT/gil_level2.txt --pid $SPID > /dev/null 2>&1
  python -m benchmarks.pyspy_summary $OUT/gil_level2.txt --rate 100 --seconds 15 \
    --threads newsstudio-live,newsstudio-speech,Thread-1,musetalk-whisper,render-batcher --depth 2 > $OUT/gil_level2_summary.txt 2>&1
) &
wait $TPID; echo "rc $?"; wait
grep "ready after" $OUT/load_musetalk30s.log
python -m benchmarks.load_summary $OUT/load_musetalk30s.json
head -60 $OUT/gil_level2_summary.txt
echo "done at $SECONDS s"
