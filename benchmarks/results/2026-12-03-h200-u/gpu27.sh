. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# 1: the batcher tests on a GPU (the switched-stream test's helper fixed; sessions on threads through the motion batcher)
NEWSSTUDIO_MEDIA_DIR=.carry/media timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_batching.py -k "switched or lmdm_windows_of_streams_on_threads or own_stream" 2>&1 | tail -40
date -u
# 2: Ditto sessions stopped speaking after the switch to front-end streams (run T): reproduce, dump thread stacks mid-level
(timeout 240 python3 -m benchmarks.load_test --engine ditto --fps 25 --weights random --size 1080 --duration 12 --accel cudagraph --client-processes 2 --sessions 4 --front-end-streams off,on,off --json $OUT/fes_probe.json > $OUT/fes_probe.log 2>&1; echo rc=$? >> $OUT/fes_probe.log) &
n=0
for want in "front-end streams off)" "front-end streams on)"; do
  for i in $(seq 1 200); do grep -q "$want" $OUT/fes_probe.log 2>/dev/null && break; sleep 1; done
  n=$((n+1)); sleep 9
  PID=$(pgrep -o -f "^python3 -m benchmarks.load_test")
  echo "dump $n pid $PID at $(date -u +%T)"
  timeout 30 py-spy dump --pid $PID > $OUT/stacks_$n.txt 2>&1; echo "py-spy rc=$?"
done
sleep 16
PID=$(pgrep -o -f "^python3 -m benchmarks.load_test"); [ -n "$PID" ] && timeout 30 py-spy dump --pid $PID > $OUT/stacks_3.txt 2>&1
wait
grep -v "^WARNING: Ditto is using" $OUT/fes_probe.log | grep -v "prebake" | tail -12
date -u
# 3: TF32 for the float32 front ends (LMDM, HuBERT): speed and error vs fp32, same run
timeout 170 python3 -m benchmarks.levers --only lmdm,hubert --batch lmdm=8,hubert=8 --levers "tf32,fp32 cudagraph,fp16 cudagraph,bf16 cudagraph,fp16 compile+cudagraph" --budget 150 --json $OUT/levers_front.json > $OUT/levers_front.log 2>&1; echo rc=$?
grep "^|\|^###" $OUT/levers_front.log | grep -v skipped | tail -30
date -u
