# Thirty-first session, call 5 (warm, 236 s of device time left; the working tree of 955d91a less its defaults change:
# batch graphs on where built): the batch graphs' device check fixed (calls 3 and 4 never took the path), checked on
# the GPU (each check fails unless the batch took the path), then one pair of 16-session levels (only the first ran
# before the time ran out).
. .carry/setup.sh; export PATH=/tmp/site/bin:$PATH
timeout 95 python -m benchmarks.batch_dispatch --accel cudagraph --busy-threads 0,16 --batches 20 --json $OUT/batch_dispatch2.json 2>&1 | grep -v Warn | tail -14
echo "at $SECONDS s"
timeout 118 python -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --accel compile+cudagraph \
  --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on --live-update-rows 10 --chunk-frames 4 \
  --warm-up-s 3 --duration 15 --sessions 16 --fill-render-batches on --batch-graphs on,off --json $OUT/load16_graphs2.json 2>&1 | grep "^\[" | tail -4
