# For the next GPU session, right after next1.sh on the same warm machine (~260 s): the same four levels with two
# render batches in flight (the server's default), so in-flight 1 and 2 compare on one machine.
SKIP_DISPATCH=1 IN_FLIGHT=2 L=330 bash benchmarks/results/2026-12-06-t31/next1.sh
