# call 3: 20 and 24 sessions, both graph families on, default 100 ms feature step (a repeat of call 2's 20-session row).
SESSIONS=20,24 BATCH_GRAPHS=on NAME=load_step100_b bash benchmarks/results/2026-12-06-t33/call2.sh
