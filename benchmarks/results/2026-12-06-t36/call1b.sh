# Thirty-sixth session, call 1b (warm after 1a, or cold): 16 MuseTalk sessions at the 30 s levels with the
# many-streams settings (tree with the chunk-buffer change); py-spy (--gil, non-blocking) samples the server's threads
# for 15 s in level NLEV (default 1): who holds the GIL, and where.
# The server's compile artifacts (serve --compile-artifacts) come back as $OUT/musetalk_compile.artifacts: carried as
# .carry/musetalk_compile.artifacts, a later cold call loads them instead of compiling (same GPU model only).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
[ -f .carry/musetalk_compile.artifacts ] && cp .carry/musetalk_compile.artifacts $OUT/
timeout -s ABRT ${LM:-400} python -X faulthandler -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --chunk-frames 4 --warm-up-s 5 --duration 30 --sessions ${LEVELS:-16} --fill-render-batches on \
  --compile-artifacts $OUT/musetalk_compile.artifacts --json $OUT/load_musetalk30s.json > $OUT/load_musetalk30s.log 2>&1 &
TPID=$!
( for i in $(seq 1 ${LM:-400}); do
    [ "$(grep -c 'level of 16 sessions starts' $OUT/load_musetalk30s.log 2>/dev/null)" -ge ${NLEV:-1} ] && break; sleep 1; done
  sleep 6; SPID=$(pgrep -P $TPID | head -1); echo "py-spy on $SPID at $SECONDS s"
  py-spy record --nonblocking --threads --gil -r 100 -d 15 -f raw -o $OUT/gil_profile.txt --pid $SPID > /dev/null 2>&1
  python -m benchmarks.pyspy_summary $OUT/gil_profile.txt --rate 100 --seconds 15 \
    --threads newsstudio-live,newsstudio-speech,Thread-1,musetalk-whisper,render-batcher --depth 2 > $OUT/gil_profile_summary.txt 2>&1
) &
wait $TPID; echo "rc $?"; wait
grep "ready after" $OUT/load_musetalk30s.log; ls -la $OUT/musetalk_compile.artifacts
A=$OUT/musetalk_compile.artifacts  # a returned file may have 16 MiB: larger, it comes back in parts (cat them)
[ -f $A ] && [ $(stat -c %s $A) -gt 16000000 ] && split -b 15000000 -d $A $A.part && rm $A && ls -la $A.part*
python -m benchmarks.load_summary $OUT/load_musetalk30s.json
head -60 $OUT/gil_profile_summary.txt
echo "done at $SECONDS s"
