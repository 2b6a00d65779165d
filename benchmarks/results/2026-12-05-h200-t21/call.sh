# One device call: the whole decoder with the layout fix (levers), then, only if a Triton row beats
# cuDNN, the MuseTalk engine with it (benchmarks.run) in the time left.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
python -m benchmarks.levers --only vae --batch vae=32 --levers "channels_last compile+cudagraph" --budget 250 --json $OUT/levers_vae.json 2>&1 | tee $OUT/levers_vae.log | grep "\[vae\]"
best=$(python - <<'PY'
import json, os
rows = {r["lever"]: r for r in json.load(open(os.environ["OUT"] + "/levers_vae.json"))["networks"]["vae"]["rows"]}
base = rows.get("fp16 channels_last compile+cudagraph, conv rewrites", {}).get("fps") or 0
flags = {"half": "triton", "mixed": "triton8m"}
good = [f for t, f in flags.items() if (rows.get(f"fp16 channels_last compile+cudagraph, conv rewrites, triton {t} convs", {}).get("fps") or 0) > base]
print(",".join(f"compile+cudagraph:{f}" for f in good))
PY
)
echo "triton variants that beat cuDNN in the decoder: ${best:-none}"
[ -n "$best" ] && timeout $((560 - SECONDS)) python -m benchmarks.run --engines musetalk --size 1080x1920 --repeat 2 --variants compile+cudagraph,$best --mp4 ultrafast:8/8/2 --json $OUT/musetalk.json 2>&1 | tee $OUT/musetalk.log | tail -30
echo "done at $SECONDS s"
