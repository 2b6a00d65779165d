# Twenty-eighth session, call 3 (~70 s warm; what the device budget left): which decoder norms take the NHWC kernels
# as Dynamo traces engine._faces on CUDA, defaults and ':rows104' (call 1: ':rows104' rendered slower, about half its
# norms on PyTorch's var_mean; on the CPU, with the interpreter, all 29 take the kernels in both).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 115 python -m benchmarks.norm_paths --json $OUT/norm_paths.json 2>&1 | grep -v "Warn\|WARNING: MuseTalk" \
  | tee $OUT/norm_paths.log | tail -40
echo "done at $SECONDS s"
