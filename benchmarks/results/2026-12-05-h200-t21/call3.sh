# The MuseTalk engine with the Triton convs that won the decoder (call 2), against cuDNN, same process
# (reference pipeline skipped: device time; its figures are in earlier runs).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout ${T:-450} python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference --variants compile+cudagraph,${V} --mp4 ultrafast:8/8/2 --json $OUT/musetalk.json 2>&1 | grep -v Warn | tee $OUT/musetalk.log | grep "\[musetalk\] ours\|^|" | tail -30
echo "done at $SECONDS s"
