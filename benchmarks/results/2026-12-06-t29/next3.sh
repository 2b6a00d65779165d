# For the next GPU session (~250 s warm): the render stage compiled per bucket at a static batch (':static', 1ddd9da)
# against the shared dynamic-batch compile, with the new default (lower-face decoder) and with the whole face; call 1
# of the twenty-ninth session ran out of time before ':static'.
V=compile+cudagraph,compile+cudagraph:static,compile+cudagraph:rows0,compile+cudagraph:rows0:static L=${L:-400} \
  bash benchmarks/results/2026-12-06-t29/call1.sh
