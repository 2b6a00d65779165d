# call2.sh of the twenty-first session's folder ran first (group_norm.*, levers_vae2.*: this folder).
# Then: the MuseTalk engine with its new defaults (channel-minor phase interleave; the decoder's GroupNorms on
# the NHWC kernels, SiLU in their apply kernel) against the same without the NHWC norms (':nogn'), reference skipped.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 540 python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference \
  --variants compile+cudagraph,compile+cudagraph:nogn --json $OUT/musetalk_gn.json 2>&1 | grep -v Warn | tee $OUT/musetalk_gn.log | grep "\[musetalk\] ours\|^|" | tail -24
echo "done at $SECONDS s"
