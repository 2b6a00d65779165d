# Twenty-fourth session, call 2. (a) Why the MuseTalk engine with the NHWC norms (':gn') does not finish its warm-up
# (twice now, ~340 s and ~390 s, where the engine without them warms up in ~110 s): the same bench for 240 s with
# Dynamo's recompile and graph-break logs, and py-spy stack dumps of it at 45, 100, 160 and 220 s. (b) The engine
# without the norms (its default since the channel-minor interleave), reference skipped. Log names without '+'.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-570}
TORCH_LOGS=recompiles,graph_breaks timeout 240 python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 \
  --skip-reference --variants compile+cudagraph:gn > $OUT/gn_diag.log 2>&1 &
pid=$!
for t in 45 100 160 220; do
  sleep $((t - SECONDS + 3)) 2>/dev/null
  child=$(pgrep -P $pid python | head -1); [ -n "$child" ] || child=$pid
  py-spy dump --pid $child > $OUT/spy_$t.txt 2>&1 || py-spy dump --pid $pid > $OUT/spy_$t.txt 2>&1
  head -c 300 $OUT/spy_$t.txt; echo
done
wait $pid; echo "gn diag rc $? at $SECONDS s"; grep -v Warn $OUT/gn_diag.log | grep -c "Recompiling\|recompil" 
left=$((L - SECONDS))
timeout $left python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference \
  --variants compile+cudagraph --json $OUT/musetalk_default.json 2>&1 | grep -v Warn | tee $OUT/musetalk_default.log | grep "\[musetalk\]\|^|" | tail -16
echo "done at $SECONDS s"
