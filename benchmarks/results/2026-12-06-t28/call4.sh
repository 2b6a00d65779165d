# Twenty-eighth session, call 4 (~40 s warm; the last of the device budget): with accel/layout.channels_last_dense
# instead of is_contiguous(memory_format=channels_last) (call 3: under Dynamo's dynamic batch on torch 2.11 that said
# False for channels-last maps, 11 decoder norms on PyTorch's path), do all 4-D decoder norms take the kernels?
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 80 python -m benchmarks.norm_paths --variants compile+cudagraph,compile+cudagraph:rows104 --json $OUT/norm_paths.json 2>&1 \
  | grep -v "Warn\|WARNING: MuseTalk" | tee $OUT/norm_paths.log | tail -30
echo "done at $SECONDS s"
