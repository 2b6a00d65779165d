"""What packing one live chunk message costs a render thread, and how much of it holds the GIL.

Why: `server.ws._pack` runs once per chunk on the render threads (16 MuseTalk sessions at 30 fps in
chunks of 4: ~120 a second, 7 MB each), and whatever it does under the GIL every other server thread
waits for. Until the thirty-sixth session the message buffer was a ``bytearray``, which CPython zeroes
(a memset of 7 MB under the GIL) before the frames are copied over it with the GIL released.

Each variant packs chunks of four 1080x1080 NV12 frames (adjacent rows of one host tensor, as a
request's copy-out leaves them) plus their audio on a worker thread, 16 messages kept alive as a send
queue would, and reports the median wall time per pack and the median of the same work's
GIL-holding part (the buffer allocation; the frame copy releases the GIL).

    python -m benchmarks.chunk_pack_cost --messages 300 --repeat 3
"""
from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from newsstudio.server.ws import _pack, _uninitialised


def _zeroed(size: int) -> np.ndarray:
    """The buffer as it was before the change: a ``bytearray`` (zeroed by CPython under the GIL), viewed."""
    return np.frombuffer(bytearray(size), np.uint8)


#: the one thing the variants change: how `_pack` gets its buffer
ALLOCATE = {"zeroed bytearray (before)": _zeroed, "uninitialised numpy (now)": _uninitialised}


def measure(variant: str, messages: int, size: int) -> dict[str, float]:
    host = torch.randint(0, 256, (16, size * 3 // 2, size), dtype=torch.uint8)
    audio = np.zeros(5880, "<f4").tobytes()
    header = {"type": "chunk", "pts": [0.0] * 4, "frame_bytes": [size * size * 3 // 2] * 4}
    total = 4 * size * size * 3 // 2 + len(audio) + 200
    allocate = ALLOCATE[variant]

    def one(i: int) -> tuple[object, float]:
        t0 = time.perf_counter()
        msg = _pack(header, *list(host[(i % 4) * 4:(i % 4) * 4 + 4]), audio, allocate=allocate)
        return msg, time.perf_counter() - t0

    def allocation(_: int) -> tuple[object, float]:  # the allocation alone: the part that holds the GIL
        t0 = time.perf_counter()
        buf = allocate(total)
        return buf, time.perf_counter() - t0

    def timed(fn) -> float:
        keep: list[object] = []  # as many alive as a send queue holds
        times = []
        with ThreadPoolExecutor(4, thread_name_prefix="render") as pool:
            for i in range(messages):
                out, dt = pool.submit(fn, i).result()
                times.append(dt)
                keep.append(out)
                if len(keep) > 16:
                    keep.pop(0)
        return statistics.median(times) * 1e3

    packs, allocs = timed(one), timed(allocation)
    frames = list(host[:4])
    assert bytes(_pack(header, *frames, audio, allocate=allocate)) == bytes(_pack(header, *frames, audio, allocate=_zeroed))
    return {"pack_ms": packs, "allocate_ms": allocs}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3, help="alternating rounds of every variant")
    ap.add_argument("--size", type=int, default=1080, help="square frame size (NV12)")
    args = ap.parse_args(argv)
    print("| round | variant | pack a 4-frame chunk, median | of it: the buffer's allocation (GIL held), median |")
    print("|---|---|---|---|")
    for r in range(1, args.repeat + 1):
        for variant in ALLOCATE:
            m = measure(variant, args.messages, args.size)
            print(f"| {r} | {variant} | {m['pack_ms']:.3f} ms | {m['allocate_ms']:.3f} ms |", flush=True)


if __name__ == "__main__":
    main()
