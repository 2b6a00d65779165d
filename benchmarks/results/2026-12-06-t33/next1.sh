# For the next GPU session's first call (cold, ~450 s): (1) the host; (2) the GPU tests of what changed on the CPU
# after the thirty-third session's device calls (streaming Whisper features with the device-side piece; capture);
# (3) 20 live MuseTalk sessions with the defaults, warm objects frozen out of garbage collections or not
# (--gc-freeze off,on twice): does the freeze remove the 0.5-1.2 s stalls (late_max_ms) and the misses at 20?
# Each level's gc_full_collections / gc_pause_max_ms say how long the collector held the GIL.
. .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
grep -m1 "model name" /proc/cpuinfo; nproc; cat /proc/loadavg
timeout 150 python -m pytest -q tests/test_musetalk_manifests.py tests/test_accel.py tests/test_gc_pauses.py \
  -k "cuda or capture or pooled or own_stream or gc or received_part or whisper_graph" -p no:cacheprovider 2>&1 | tail -3
echo "checks done at $SECONDS s"
SESSIONS=20,20 EXTRA="--gc-freeze off,on" NAME=load_gc_freeze LB=${LB:-400} \
  bash benchmarks/results/2026-12-06-t33/musetalk_defaults.sh
echo "done at $SECONDS s"
