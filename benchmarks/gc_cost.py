"""What one full garbage collection costs a warm process, with and without the objects frozen.

Why: a full (generation 2) collection holds the GIL while it walks every tracked object, so in the
live server every session stops for as long. This loads engines as the server does (weights,
accel, warm-up), then times `gc.collect()` as it is and after `freeze_warm_objects()`
(server/gc_pauses.py, what `serve` does after each engine's warm-up).

    python -m benchmarks.gc_cost --engines musetalk --device cuda --accel compile+cudagraph --json gc_cost.json
    python -m benchmarks.gc_cost --engines classic,musetalk --device cpu
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path


def full_collection_ms(repeat: int) -> float:
    """Median milliseconds of one `gc.collect()` (all generations) over ``repeat`` runs."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def tracked_objects() -> int:
    """Objects the collector walks (the permanent generation is not among them)."""
    return sum(len(gc.get_objects(generation=g)) for g in range(3))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="musetalk", help="comma-separated engines to load, in order")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--accel", default="auto", help="as serve's --accel (auto: compile+cudagraph on CUDA)")
    ap.add_argument("--weights", default="random")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    import torch

    from newsstudio.engines.registry import create_engine, engine_options
    from newsstudio.server.gc_pauses import freeze_warm_objects, unfreeze

    rows = [{"stage": "imports", "objects": tracked_objects(), "full_collection_ms": full_collection_ms(args.repeat)}]
    engines = []
    for name in filter(None, args.engines.split(",")):
        t = time.perf_counter()
        kw = engine_options(name, args.weights, None, args.accel, args.device, long_running=True)
        eng = create_engine(name, device=torch.device(args.device), **kw)
        eng.warm_up()
        engines.append(eng)
        rows.append({"stage": f"+ {name} warm ({time.perf_counter() - t:.0f} s)", "objects": tracked_objects(),
                     "full_collection_ms": full_collection_ms(args.repeat)})
    frozen = freeze_warm_objects()
    rows.append({"stage": f"frozen ({frozen} objects)", "objects": tracked_objects(),
                 "full_collection_ms": full_collection_ms(args.repeat)})
    unfreeze()
    for r in rows:
        print(f"{r['stage']:<40} {r['objects']:>10,} objects walked | full collection {r['full_collection_ms']:8.1f} ms")
    out = {"engines": args.engines, "device": args.device, "accel": args.accel, "python_gc_thresholds": gc.get_threshold(),
           "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
