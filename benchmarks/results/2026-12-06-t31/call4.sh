# Thirty-first session, call 4 (cold): 16 MuseTalk sessions at 30 fps, batches filled to their buckets, one-avatar
# batches by the batch graphs or the general path, three pairs alternating; each level with the GIL probe
# (benchmarks/gil_probe.py: how late a thread that sleeps 2 ms gets the GIL back in the server's process).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-450}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16 --fill-render-batches on \
  --batch-graphs on,off,on,off,on,off --json $OUT/load_musetalk16_gil.json 2>&1 | grep -v Warn | tee $OUT/load_musetalk16_gil.log \
  | grep "^\[" | tail -14
python - $OUT/load_musetalk16_gil.json <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])):
    print("batch graphs", r["batch_graphs"], "sustained", r["sustained"], "fps", r["server_fps"], "fps median", round(r["fps_median"], 1),
          "batch", round(r["batch_frames_mean"], 1), "render busy", round(r["render_busy_share"], 2),
          "audio busy", round(r["audio_busy_share"], 2), "loop lag p95", r["loop_lag_p95_ms"],
          "GIL wait p50/p95/max", r.get("gil_wait_p50_ms"), r.get("gil_wait_p95_ms"), r.get("gil_wait_max_ms"),
          "render call", round(r["session_render_call_ms"], 1), "wait", round(r["session_render_wait_ms"], 1),
          "skipped", r["skipped_frames_per_session"], "timeline", r["server_fps_timeline"])
PY
echo "done at $SECONDS s"
