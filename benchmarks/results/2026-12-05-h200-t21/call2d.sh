# The engines with the NHWC norms (':gn') against their defaults, reference skipped (run after call2 and
# call2b say the norms pay). E: musetalk or ditto. (Twenty-second session; not yet run.)
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
E=${E:-musetalk}
timeout 585 python -m benchmarks.${E}_bench --size 1080x1920 --repeat 2 --skip-reference \
  --variants compile+cudagraph,compile+cudagraph:gn --json $OUT/${E}_gn.json 2>&1 | grep -v Warn | tee $OUT/${E}_gn.log | grep "\[$E\] ours\|^|" | tail -20
echo "done at $SECONDS s"
