# For the next GPU session, right after next1.sh on the same warm machine (server ready in ~60 s from the compile cache;
# ~260 s): 16 MuseTalk sessions, batches filled to their buckets, under the two host-side levers the profile may point
# to: the GIL hand-off interval (the server's 0.5 ms vs Python's 5 ms) and the live Whisper update step (10 rows = every
# 200 ms, as in every 16-session run so far, vs 25 rows = every 500 ms: ~2.5x fewer 30 s re-encodes; the audio batcher
# was busy 0.77-0.81 of each second in the thirtieth session's call 1). One level each, in the load test's order.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-300}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16 --fill-render-batches on \
  --switch-intervals 0.0005,0.005 --live-update-rows 10,25 \
  --json $OUT/load_musetalk16_host.json 2>&1 | grep -v Warn | tee $OUT/load_musetalk16_host.log \
  | grep -v "^V1\|^\s" | tail -12
python - $OUT/load_musetalk16_host.json <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["switch_interval_ms"], r["live_update_rows"], "sustained", r["sustained"], "fps", r["server_fps"],
          "fill", round(r["bucket_fill"], 3), "render busy", round(r["render_busy_share"], 2),
          "audio busy", round(r["audio_busy_share"], 2), "loop lag p95", r["loop_lag_p95_ms"])
PY
echo "done at $SECONDS s"
