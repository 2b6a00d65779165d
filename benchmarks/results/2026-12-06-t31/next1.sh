# For the next GPU session's first call (cold; ~420 s of wall time): (1) the two graph paths made in the thirty-first
# session checked on the GPU -- MuseTalk batch graphs (engines/musetalk/batch_graphs.py; checked bytes-equal in call 5)
# and the sessions' compose graphs (compose/session_graphs.py; new, CPU-tested only) -- each check fails unless the
# graph path was taken, then their dispatch and launch times beside 16 busy threads; (2) 16 MuseTalk sessions at 30 fps
# with one render batch in flight (the batch graphs made the render thread quick enough that two in flight gave
# 19-frame batches), batch graphs x compose graphs on/off. Every level reports the GIL probe and its threads' CPU.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
if [ -z "$SKIP_DISPATCH" ]; then
  timeout 150 python -m benchmarks.batch_dispatch --accel cudagraph --busy-threads 0,16 --batches 20 \
    --json $OUT/batch_dispatch.json 2>&1 | grep -v Warn | tail -24
  echo "dispatch check done at $SECONDS s"
fi
L=${L:-400}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16 --fill-render-batches on \
  --render-in-flight ${IN_FLIGHT:-1} --batch-graphs on,off --compose-graphs on,off \
  --json $OUT/load_musetalk16_graphs.json 2>&1 | grep -v Warn | tee $OUT/load_musetalk16_graphs.log | grep "^\[" | tail -10
python - $OUT/load_musetalk16_graphs.json <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])):
    print("in flight", r["render_in_flight"], "batch graphs", r["batch_graphs"], "compose graphs", r["compose_graphs"],
          "sustained", r["sustained"], "fps", r["server_fps"], "fps min/median", round(r["fps_min"], 1), round(r["fps_median"], 1),
          "batch", round(r["batch_frames_mean"], 1), "render busy", round(r["render_busy_share"], 2),
          "GIL wait p50/p95", r.get("gil_wait_p50_ms"), r.get("gil_wait_p95_ms"),
          "render call / wait / copy-out", round(r["session_render_call_ms"], 1), round(r["session_render_wait_ms"], 1),
          round(r["session_copy_out_ms"], 1), "skipped", r["skipped_frames_per_session"])
    print("   server thread CPU (cores):", list((r.get("thread_cpu") or {}).items())[:8])
PY
echo "done at $SECONDS s"
