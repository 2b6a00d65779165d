# For the next GPU session, after next1.sh (~250 s warm): the decoder alone, as the engine runs it (NHWC norms, cuDNN)
# vs the same for rows 104-255, compiled (mode default for all three rows, to keep the call short) and replayed from a
# CUDA graph at batch 32; plus the error table of benchmarks/RESULTS.md (twenty-seventh session) on the GPU in fp16.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout ${L:-500} python -m benchmarks.lower_face_decoder --batch 32 --first-rows 104 --compile-mode default \
  --json $OUT/lower_face_decoder.json 2>&1 | grep -v "Warn\|AUTOTUNE\|^strides\|^dtypes\|SingleProcess\|num_choices" \
  | tee $OUT/lower_face_decoder.log | tail -20
echo "done at $SECONDS s"
