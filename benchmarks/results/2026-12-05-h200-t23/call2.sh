# call2.sh of the twenty-first session's folder ran first (group_norm.*, levers_vae2.*: this folder).
# Then: the MuseTalk engine with its new defaults (channel-minor phase interleave; the decoder's GroupNorms on
# the NHWC kernels, SiLU in their apply kernel), then the same without the NHWC norms (':nogn') if time is left;
# reference skipped (its figures are in earlier runs). L: seconds this call may take.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-580}
for v in compile+cudagraph compile+cudagraph:nogn; do
  left=$((L - SECONDS)); [ $left -gt 120 ] || break
  # (as run: the log name below kept a "+", which the device tool did not return)
  timeout $left python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference \
    --variants $v --json $OUT/musetalk_${v#*:}.json 2>&1 | grep -v Warn | tee $OUT/musetalk_${v#*:}.log | grep "\[musetalk\] ours\|^|" | tail -16
done
echo "done at $SECONDS s"
