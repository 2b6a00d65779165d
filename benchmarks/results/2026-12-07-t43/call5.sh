# forty-third session, call 5 (the last ~400 s of device budget after twelve refused starts): plain CUDA graphs
# (relative figures only), stride 8's MP4 with host rows and with device rows in one process, then the CUDA stride
# tests if time is left.
source .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout ${L:-160} python -m benchmarks.ditto_bench --skip-reference --variants cudagraph --repeat 2 --stride 8 \
  --stride-psnr-modes mask --stride-device-rows --mp4 "ultrafast:12/8/1~8,ultrafast:8/8/1" \
  --json $OUT/ditto_stride8_mp4.json > $OUT/ditto_stride8_mp4.log 2>&1; echo "bench rc $? at $SECONDS s"
grep -v WARNING $OUT/ditto_stride8_mp4.log | grep "MP4\|stride 8\|dense fps\|first frame" | tail -16
left=$((${END:-190} - SECONDS))
[ $left -ge 25 ] && timeout $left python -m pytest -q -p no:cacheprovider tests/test_ditto_stride.py -k "cuda" 2>&1 | tail -3
