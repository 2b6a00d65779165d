# call 5 (warm, same host as call 4): 16 MuseTalk sessions, batch graphs off then on (compose graphs on by default).
SESSIONS=16 EXTRA="--batch-graphs off,on" NAME=load_defaults_ab bash benchmarks/results/2026-12-06-t33/musetalk_defaults.sh
