# Thirty-first session, call 3 (cold): MuseTalk batch graphs (engines/musetalk/batch_graphs.py) -- same bytes as the
# general path on the GPU, the render thread's dispatch per batch alone and beside 16 busy threads, then 16 live
# sessions at 30 fps with one-avatar batches by the batch graphs or the general path, alternating.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 200 python -m benchmarks.batch_dispatch --accel cudagraph --busy-threads 0,16 --json $OUT/batch_dispatch.json 2>&1 \
  | grep -v Warn | tee $OUT/batch_dispatch.log | tail -16
echo "dispatch done at $SECONDS s"
L=${L:-330}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16 --fill-render-batches on \
  --batch-graphs on,off,on,off --json $OUT/load_musetalk16_graphs.json 2>&1 | grep -v Warn | tee $OUT/load_musetalk16_graphs.log \
  | grep -v "^V1\|^\s" | tail -12
python - $OUT/load_musetalk16_graphs.json <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])):
    print("batch graphs", r["batch_graphs"], "sustained", r["sustained"], "fps", r["server_fps"], "fps median", round(r["fps_median"], 1),
          "fill", round(r["bucket_fill"], 3), "batch", round(r["batch_frames_mean"], 1), "render busy", round(r["render_busy_share"], 2),
          "audio busy", round(r["audio_busy_share"], 2), "loop lag p95", r["loop_lag_p95_ms"], "render call", round(r["session_render_call_ms"], 1),
          "wait", round(r["session_render_wait_ms"], 1), "skipped", r["skipped_frames_per_session"])
PY
echo "done at $SECONDS s"
