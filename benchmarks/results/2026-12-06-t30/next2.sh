# For the next GPU session (~420 s warm), on an H200 if one is lent (the goal's machine): the MuseTalk summary row next
# to its reference-style pipeline, with the thirtieth session's defaults and the tuned MP4 configuration of the twelfth
# session (run ZB: 0.49 s).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-560}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.run --engines musetalk --size 1080x1920 --repeat 3 \
  --variants compile+cudagraph --mp4 ultrafast:8/8/2 --json $OUT/run_musetalk.json 2>&1 | grep -v Warn \
  | tee $OUT/run_musetalk.log | grep "\[musetalk\]\|^|\|rror" | tail -24
echo "recompiles: $(grep -c 'Recompiling function' $OUT/run_musetalk.log) at $SECONDS s"
