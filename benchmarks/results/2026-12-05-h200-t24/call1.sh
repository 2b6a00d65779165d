# Twenty-fourth session, call 1. (a) The VAE decoder alone with the NHWC norms (+ SiLU) only on maps of at least
# 64^2 / 128^2 / 256^2 (PyTorch's norms below: the kernels alone lost to Inductor's on small maps), against the
# engine's decoder without and with them everywhere. (b) The MuseTalk engine with the norms (':gn') and without,
# one process each, reference skipped. L: seconds this call may take. Log names without '+'.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
L=${L:-580}
R="fp16 channels_last compile+cudagraph, conv rewrites"
timeout 250 python -m benchmarks.levers --only vae --batch vae=32 --budget 220 --json $OUT/levers_vae3.json \
  --levers "$R;$R, nhwc group norms + silu;$R, nhwc group norms + silu from 64^2;$R, nhwc group norms + silu from 128^2;$R, nhwc group norms + silu from 256^2" \
  2>&1 | grep -v Warn | tee $OUT/levers_vae3.log | grep "^|" | tail -12
for v in compile+cudagraph:gn compile+cudagraph; do
  left=$((L - SECONDS)); [ $left -gt 150 ] || break
  name=musetalk_$(echo $v | tr '+:' '__')
  timeout $left python -m benchmarks.musetalk_bench --size 1080x1920 --repeat 2 --skip-reference \
    --variants $v --json $OUT/$name.json 2>&1 | grep -v Warn | tee $OUT/$name.log | grep "\[musetalk\]\|^|" | tail -16
done
echo "done at $SECONDS s"
