# For the next GPU session (cold, ~200 s): Ditto's cold first level (thirty-ninth session: 0 of 8 in a fresh server's
# first 30 s level, 8 of 8 in the second; render calls 2.4x longer, +841 MB of GPU memory that stayed). Three 8-session
# levels with /metrics' compile_work tallied per level and, with memory, once a second (graph captures,
# torch.compile frames): if the first level's sag (20 s in, last time) comes with captures, compiles or memory growth
# the later levels do not show, that names the work.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout -s ABRT ${LD:-260} python -X faulthandler -m benchmarks.load_test --engine ditto --fps 30 --weights random \
  --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 8 --render-leads 0.15 --send-on-clock on \
  --warm-up-s 5 --duration 30 --sessions 8,8,8 --json $OUT/load_ditto_cold.json > $OUT/load_ditto_cold.log 2>&1; echo "rc $?"
python -m benchmarks.load_summary $OUT/load_ditto_cold.json
python - <<'PY'  # each level's seconds: frame rate, RSS / GPU MB, graph captures / compiled frames since start
import json, os
for i, r in enumerate(json.load(open(os.environ["OUT"] + "/load_ditto_cold.json")), 1):
    print(f"level {i}:", " ".join(f"{f:.0f}|{m[0]}/{m[1]}|{w[0]}/{w[1]}" for f, m, w in
                                  zip(r["server_fps_timeline"], r["memory_timeline_mb"], r["compile_work_timeline"])))
PY
echo "done at $SECONDS s"
