# forty-third session, call 1: stride mode's rows handed to the renderer on the host (no device sync per chunk) --
# the CUDA test that host and device rows give the same frames, then stride 8's MP4 per encoder configuration with
# host rows (default) and again with device rows (--stride-device-rows), each with "these chunks rendered alone".
source .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_ditto_stride.py -k "cuda or runner or idle" 2>&1 | tail -3
timeout ${L:-430} python -m benchmarks.ditto_bench --skip-reference --variants compile+cudagraph --repeat 2 --stride 8 \
  --stride-psnr-modes mask --stride-device-rows --mp4 "ultrafast:12/8/1~8,ultrafast:12/8/1,ultrafast:8/8/1~8,ultrafast:8/8/1" \
  --json $OUT/ditto_stride8_mp4.json > $OUT/ditto_stride8_mp4.log 2>&1; echo "rc $? at $SECONDS s"
grep -v WARNING $OUT/ditto_stride8_mp4.log | grep "MP4\|stride 8\|dense fps\|first frame" | tail -16
