# For the next GPU session (~500 s cold): does decoding only the face rows the blend uses pay?
# 1. benchmarks.lower_face_decoder: the engine's compiled decoder (NHWC norms, cuDNN) vs the same for rows 104-255
#    and 112-255, graphed, batch 32; with the error (silence-face statistics) on the real architecture.
# 2. If (1) finished with time left: the MuseTalk engine dense, defaults vs ':rows104' (same process, reference skipped).
# Decide: keep first_face_row=0 unless dense gains >= ~8 % at an error the note can defend (CPU, seeded: see RESULTS).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-560}
timeout 300 python -m benchmarks.lower_face_decoder --batch 32 --first-rows 104,112 --json $OUT/lower_face_decoder.json \
  2>&1 | grep -v "Warn\|AUTOTUNE\|^strides\|^dtypes\|SingleProcess\|num_choices" | tee $OUT/lower_face_decoder.log | tail -20
echo "lower_face_decoder done at $SECONDS s"
left=$((L - SECONDS))
if [ $left -gt 240 ]; then
  TORCH_LOGS=recompiles timeout $left python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference \
    --variants compile+cudagraph,compile+cudagraph:rows104 --json $OUT/musetalk_rows.json 2>&1 | grep -v Warn \
    | tee $OUT/musetalk_rows.log | grep "\[musetalk\]\|^|\|rror" | tail -16
fi
echo "done at $SECONDS s"
