# For the next GPU session's first call (cold; L=480): 16 MuseTalk live sessions at 30 fps with the thirtieth session's
# defaults (lower-face decoder, batch 32 compiled static: render stage 699 frames/s dense), batches as queued and filled
# to their buckets (bucket_fill / split_requests now reach the metrics, 488a5fe), each level profiled for 3 s mid-level
# (GPU busy share, host-side CUDA calls per thread: benchmarks/gpu_timeline.py). Call 1 of the thirtieth session: 0-2 of
# 16 at 419-468 frames/s with a render stage 23 % faster than the whole face's; the render's GPU time ~0.80 s a second.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-480}
TORCH_LOGS=recompiles timeout $L python -m benchmarks.load_test --engine musetalk --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 16 --render-leads 0.5 --send-on-clock on \
  --live-update-rows 10 --chunk-frames 4 --warm-up-s 5 --duration 20 --sessions 16,16 --fill-render-batches off,on \
  --profile-s 3 --profile-levels 1,2 --json $OUT/load_musetalk16_profiled.json 2>&1 | grep -v Warn | tee $OUT/load_musetalk16_profiled.log \
  | grep -v "^V1\|^\s" | tail -14
echo "recompiles: $(grep -c 'Recompiling function' $OUT/load_musetalk16_profiled.log)"
python - $OUT/load_musetalk16_profiled.json <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])):
    t = r.get("gpu_timeline") or {}
    print(r["sessions"], r["fill_render_batches"], r["sustained"], r["server_fps"], "fill", round(r["bucket_fill"], 3),
          "split", r["split_requests"], "gpu busy", t.get("gpu_busy_share"),
          "streams", [(x["stream"], x["busy_share"]) for x in t.get("streams", [])],
          "runtime", [(x["name"], x["ms"], x["count"], x["max_ms"]) for x in (t.get("runtime") or [])[:5]])
    for x in (t.get("threads") or [])[:5]:
        print("   thread", x["thread"], x["runtime_share"], x["runtime_calls"], x["longest_call"])
    for name, st in ((t.get("stacks") or {}).get("threads") or {}).items():
        if "batcher" in name or name == "MainThread":
            print("   stacks", name, st["seen"], [(w["where"], w["share"]) for w in st["top"][:4]])
PY
echo "done at $SECONDS s"
