. .carry/setup.sh
set -o pipefail
date -u
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_accel.py tests/test_batching.py -k "cuda or own_stream" 2>&1 | tail -5
date -u
for fes in "" "--front-end-streams"; do
  echo "=== musetalk $fes"
  timeout 260 python3 -m benchmarks.load_test --engine musetalk --fps 30 --weights random --size 1080 --duration 20 --accel compile+cudagraph --client-processes 4 --sessions 6,8,10 $fes --json $OUT/load_musetalk${fes:+_fes}.json > $OUT/load_musetalk${fes:+_fes}.log 2>&1; echo rc=$?
  grep -v "^WARNING: MuseTalk is using" $OUT/load_musetalk${fes:+_fes}.log | grep -v "prebake" | tail -8
  date -u
done
