. .carry/setup.sh
set -o pipefail
date -u
# Ditto with front-end streams (run X: 8/8 with them, the graph-family fix), 30 s levels (the goal's "30 s on time"),
# with and without the TF32 front end (levers: LMDM 17.6 -> 8.6 ms, HuBERT 9.9 -> 3.9 ms per 8 windows); two servers, same machine
for tf in "" "--front-end-tf32"; do
  timeout 200 python3 -m benchmarks.load_test --engine ditto --fps 25 --weights random --size 1080 --duration 30 --accel compile+cudagraph --client-processes 4 --sessions 8,10 --warm-up-s 6 --front-end-streams on $tf --json $OUT/load_ditto${tf:+_tf32}.json > $OUT/load_ditto${tf:+_tf32}.log 2>&1; echo "tf32=[$tf] rc=$?"
  grep -v "^WARNING: Ditto is using" $OUT/load_ditto${tf:+_tf32}.log | grep -v "prebake" | tail -6
  date -u
done
