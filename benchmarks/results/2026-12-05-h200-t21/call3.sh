# The MuseTalk engine with the Triton convs that won the decoder (call 2), against cuDNN, same process.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout ${T:-450} python -m benchmarks.run --engines musetalk --size 1080x1920 --repeat 2 --variants compile+cudagraph,${V} --mp4 ultrafast:8/8/2 --json $OUT/musetalk.json 2>&1 | tee $OUT/musetalk.log | tail -32
echo "done at $SECONDS s"
