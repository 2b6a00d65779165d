# After the channels-last phase interleave: the levers rows that matter (cuDNN baseline, Triton half,
# Triton mixed; compiled + graphed; cuDNN with the channel-minor interleave); if no Triton row wins, the compiled decoder's kernels to see why.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
python -m benchmarks.levers --only vae --batch vae=32 --levers "fp16 channels_last compile+cudagraph, conv rewrites;fp16 channels_last compile+cudagraph, conv rewrites, channels-last interleave;fp16 channels_last compile+cudagraph, conv rewrites, triton half convs;fp16 channels_last compile+cudagraph, conv rewrites, triton mixed convs" --budget 300 --json $OUT/levers_vae2.json 2>&1 | tee $OUT/levers_vae2.log | grep "\[vae\]"
best=$(python - <<'PY'
import json, os
rows = {r["lever"]: r for r in json.load(open(os.environ["OUT"] + "/levers_vae2.json"))["networks"]["vae"]["rows"]}
base = rows.get("fp16 channels_last compile+cudagraph, conv rewrites", {}).get("fps") or 0
flags = {"half": "triton", "mixed": "triton8m"}
print(",".join(f for t, f in flags.items() if (rows.get(f"fp16 channels_last compile+cudagraph, conv rewrites, triton {t} convs", {}).get("fps") or 0) > base))
PY
)
echo "triton flags that beat cuDNN in the decoder: ${best:-none}"
[ -z "$best" ] && timeout 170 python benchmarks/results/2026-12-05-h200-t21/diag_compiled_vae.py 2>&1 | grep -v Warn > $OUT/diag_compiled2.log && grep "ms/batch\|by kind" $OUT/diag_compiled2.log
echo "done at $SECONDS s"
