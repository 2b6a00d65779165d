# For the next session, right after next1.sh on the same warm machine (~120 s): where the GPU's time goes at 16
# MuseTalk sessions (filled batches): a 4 s profile mid-level, per CUDA stream (the Whisper batcher runs on a stream
# of its own: its share of the GPU is what 16 streams' feature updates every 200 ms cost the render).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout ${L:-300} python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16 --fill-render-batches ${FILL:-on} \
  --profile-s 4 --json $OUT/load_musetalk16_profile.json 2>&1 | grep -v Warn | tee $OUT/load_musetalk16_profile.log \
  | grep -v "^V1" | tail -45
echo "done at $SECONDS s"
