# Twenty-eighth session, call 2 (~330 s warm): call 1 showed the engine's ':rows104' render SLOWER (67.97 vs 61.58 ms
# per 32, H100) with about half its decoder norms on PyTorch's var_mean, while the decoder alone gained 28 %.
# (a) which decoder norms take the NHWC kernels as Dynamo traces engine._faces on CUDA (no Inductor: seconds);
# (b) the render-stage profile of ":rows104" again (budget: the defaults are call 1's), with every cut map and norm input made channels-last (tree below).
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
timeout 90 python -m benchmarks.norm_paths --json $OUT/norm_paths.json 2>&1 | grep -v "Warn\|WARNING: MuseTalk" \
  | tee $OUT/norm_paths.log | tail -40
echo "(a) done at $SECONDS s"
timeout $((225 - SECONDS)) python -m benchmarks.render_profile --variants compile+cudagraph:rows104 \
  --profiled 3 --top 16 --repeat 10 --max-frames 50 --json $OUT/render_profile.json 2>&1 \
  | grep -v "Warn\|AUTOTUNE\|^strides\|^dtypes\|SingleProcess\|num_choices\|USDT\|statistics:" \
  | tee $OUT/render_profile.log | grep -v "WARNING: MuseTalk" | tail -40
echo "done at $SECONDS s"
