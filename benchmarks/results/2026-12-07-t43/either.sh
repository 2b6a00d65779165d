# forty-third session: on an H200 the goal run (PART=musetalk first, as next_goal.sh), on an H100 call $H100
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "H200: PART=${PART:-musetalk}"; PART=${PART:-musetalk} L=${L:-540} bash benchmarks/results/2026-12-06-t33/next_goal.sh
else
  bash benchmarks/results/2026-12-07-t43/${H100:-call3}.sh
fi
