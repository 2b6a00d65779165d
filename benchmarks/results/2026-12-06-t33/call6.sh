# call 6 (warm, same host as calls 4-5): call 4's MuseTalk part again (the defaults, 16 and 20 sessions).
SESSIONS=16,20 NAME=load_defaults_b bash benchmarks/results/2026-12-06-t33/musetalk_defaults.sh
