# For the next GPU session's first call (cold; ~420 s): 16 MuseTalk sessions at 30 fps, batches filled to their
# buckets, one-avatar batches by the batch graphs (engines/musetalk/batch_graphs.py; off by default) or the general
# path, with one or two render batches in flight. Why: with the batch graphs the render thread's busy share fell from
# 0.84-0.89 to 0.37 (thirty-first session, call 5, one level), but its batches came out at 19 frames instead of 27
# (with two in flight it takes the next batch as soon as the previous one is launched); one in flight should let
# requests pile up while the GPU works. Each level also reports the GIL probe (p50 ~1.1 ms in every level so far).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-480}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16 --fill-render-batches on \
  --render-in-flight 1,2 --batch-graphs on,off,on,off --json $OUT/load_musetalk16_inflight.json 2>&1 | grep -v Warn \
  | tee $OUT/load_musetalk16_inflight.log | grep "^\[" | tail -18
python - $OUT/load_musetalk16_inflight.json <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])):
    print("in flight", r["render_in_flight"], "batch graphs", r["batch_graphs"], "sustained", r["sustained"], "fps", r["server_fps"],
          "fps min/median", round(r["fps_min"], 1), round(r["fps_median"], 1), "batch", round(r["batch_frames_mean"], 1),
          "render busy", round(r["render_busy_share"], 2), "GIL wait p50/p95", r.get("gil_wait_p50_ms"), r.get("gil_wait_p95_ms"),
          "render call / wait", round(r["session_render_call_ms"], 1), round(r["session_render_wait_ms"], 1),
          "skipped", r["skipped_frames_per_session"])
PY
echo "done at $SECONDS s"
