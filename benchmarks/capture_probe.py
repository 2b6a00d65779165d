"""Which work in other threads breaks a thread-local CUDA graph capture, and whether the device's
random number generators still work after a capture that failed.

Why: `accel.graph_capture.capture` makes a live session's graphs while other sessions keep
launching; on the thirty-fifth session's H100 its test (other threads cycling through 64 streams,
each cycle ended with ``torch.cuda.synchronize``) failed 8 of 9 runs with
``cudaErrorStreamCaptureInvalidated``, and a failed capture left every later random draw failing.
Each variant runs captures while two threads work on 64 streams each, ending each cycle with a
different wait: the whole device (expected to invalidate captures: CUDA lets a device-wide wait
from any thread invalidate every capture on that GPU, whatever its mode), each stream, one
event (what the server's threads do), or a host read on the legacy default stream (``.item()``).
Prints one JSON line per variant.

    python -m benchmarks.capture_probe --captures 40
"""
from __future__ import annotations

import argparse
import json
import threading

import torch

from newsstudio.accel.graph_capture import capture, normal_tensor


def _user(dev: torch.device, wait: str, stop: threading.Event, errors: list[str]) -> None:
    try:
        streams = [torch.cuda.Stream() for _ in range(64)]
        x = torch.randn(256, 256, device=dev)
        while not stop.is_set():
            for s in streams:
                ready = torch.cuda.Event()
                ready.record(torch.cuda.current_stream())
                s.wait_event(ready)
                with torch.cuda.stream(s):
                    x = torch.tanh(x @ x) * 0.5
            if wait == "device":
                torch.cuda.synchronize()
            elif wait == "item":  # a host read on the thread's default (legacy) stream, as `.item()` or `.cpu()` does
                ready = torch.cuda.Event()
                ready.record(streams[-1])
                torch.cuda.current_stream().wait_event(ready)
                float(x.sum().item())
            elif wait == "streams":
                for s in streams:
                    s.synchronize()
            else:
                done = torch.cuda.Event()
                done.record(streams[-1])
                done.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported
        errors.append(f"{type(exc).__name__}: {exc}"[:200])


def run_variant(wait: str, captures: int) -> dict:
    """``captures`` captures, each replayed and checked, beside two threads ending their cycles with ``wait``."""
    dev = torch.device("cuda")
    stop = threading.Event()
    errors: list[str] = []
    users = [threading.Thread(target=_user, args=(dev, wait, stop, errors), daemon=True) for _ in range(2)]
    for t in users:
        t.start()
    failed, wrong, rng_broken, first = 0, 0, 0, None
    try:
        for k in range(captures):
            a = normal_tensor(lambda: torch.randn(64, 64, device=dev))
            out = normal_tensor(lambda: torch.empty(64, 64, device=dev))
            try:
                replay = capture(lambda: out.copy_(torch.relu(a) * 2 + k), dev)
                a.normal_()
                replay()
                torch.cuda.current_stream().synchronize()
                wrong += not torch.allclose(out, torch.relu(a) * 2 + k)
            except RuntimeError as exc:
                failed += 1
                first = first or str(exc).splitlines()[0][:160]
            try:
                torch.randn(4, device=dev)
            except RuntimeError:
                rng_broken += 1
    finally:
        stop.set()
        for t in users:
            t.join(timeout=60)
    torch.cuda.synchronize()
    return {"wait": wait, "captures": captures, "failed": failed, "wrong_replays": wrong,
            "random_draws_failed": rng_broken, "first_error": first, "thread_errors": errors[:2]}


def forced_failure() -> dict:
    """A capture that copies to the host (not allowed while capturing) fails; does a random draw work after?"""
    dev = torch.device("cuda")
    x = torch.rand(8, device=dev)
    try:
        capture(lambda: float(x.sum().cpu()), dev)
        result = "captured (unexpected)"
    except RuntimeError as exc:
        result = str(exc).splitlines()[0][:160]
    try:
        torch.rand(4, device=dev)
        draw = "ok"
    except RuntimeError as exc:
        draw = str(exc).splitlines()[0][:160]
    return {"forced_failure": result, "random_draw_after": draw}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--captures", type=int, default=40)
    ap.add_argument("--waits", default="device,streams,event,item")
    args = ap.parse_args()
    print(json.dumps(forced_failure()), flush=True)
    for wait in args.waits.split(","):
        print(json.dumps(run_variant(wait, args.captures)), flush=True)


if __name__ == "__main__":
    main()
