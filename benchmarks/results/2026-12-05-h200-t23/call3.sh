# For the next session (not yet run): the MuseTalk engine with the NHWC decoder norms (':gn', SiLU in the apply
# kernel, after the double-compile fix) against its default, reference skipped. One variant per process so each gets
# the whole of its own timeout; budget ~250 s each (run ZB warmed up in 109 s). Log names without '+' (the device
# tool does not return such names).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-580}
for v in compile+cudagraph:gn compile+cudagraph; do
  left=$((L - SECONDS)); [ $left -gt 150 ] || break
  name=musetalk_$(echo $v | tr '+:' '__')
  timeout $left python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference \
    --variants $v --json $OUT/$name.json 2>&1 | grep -v Warn | tee $OUT/$name.log | grep "\[musetalk\]\|^|" | tail -16
done
echo "done at $SECONDS s"
