"""CPU a uvicorn WebSocket server's event loop spends per GB of binary messages it sends, per
implementation and event loop.

Why: a live server sending raw NV12 chunks (1.75 MB per 1080x1080 frame, ~0.6 GB/s for 12 sessions
at 30 fps) spends that CPU on its event loop, and what of it runs under the GIL every other server
thread (render, speech, sessions) waits through. The server runs in a child process (uvicorn,
FastAPI, per-message deflate off, as `newsstudio serve` runs it, on the event loop chosen: uvloop is
what uvicorn picks where it is installed); this process receives and reads the CPU time of the
child's event loop (its main thread) from /proc. Which of that CPU holds the GIL is py-spy's to say
(`py-spy record --gil`; benchmarks/RESULTS.md, thirty-ninth session): the CPU alone cannot tell
uvloop's write (the kernel's copy under the GIL) from ``os.writev`` (the same copy without it).

    python -m benchmarks.ws_send_cost --impls websockets-sansio,websockets,direct-transport,direct --loops uvloop,asyncio
"""
from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time

from .thread_cpu import thread_cpu_s

SERVER = """
import sys, uvicorn
from fastapi import FastAPI, WebSocket
from newsstudio.server.ws_direct import DirectBinarySender
app = FastAPI()
payload = bytearray(int(sys.argv[3]))
impl = sys.argv[2]
direct = impl.startswith("direct")
@app.websocket("/ws")
async def ws(w: WebSocket):
    await w.accept()
    sender = DirectBinarySender(w, socket_writes=impl == "direct")
    if direct and not sender.direct:
        raise SystemExit("the direct sender does not apply to this connection")
    for _ in range(int(await w.receive_text())):
        if not (direct and await sender.send(payload)):
            await w.send_bytes(payload)
    await w.close()
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), ws="websockets-sansio" if direct else impl,
            ws_per_message_deflate=False, log_level="warning", loop=sys.argv[4])
"""


async def receive(port: int, n: int) -> int:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    got = 0
    async with connect(f"ws://127.0.0.1:{port}/ws", max_size=None, open_timeout=30) as c:
        await c.send(str(n))
        try:
            while True:
                got += len(await c.recv())
        except ConnectionClosed:
            pass
    return got


def measure(impl: str, messages: int, size: int, loop: str = "uvloop") -> tuple[float, float, float]:
    """(GB sent, wall s, the server event loop's CPU s) for `messages` messages of `size` bytes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-c", SERVER, str(port), impl, str(size), loop])
    try:
        for _ in range(100):  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        asyncio.run(receive(port, 5))  # warm
        c0, t0 = thread_cpu_s(p.pid, p.pid), time.perf_counter()  # the event loop: the server's main thread
        got = asyncio.run(receive(port, messages))
        return got / 1e9, time.perf_counter() - t0, thread_cpu_s(p.pid, p.pid) - c0
    finally:
        p.terminate()
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impls", default="websockets-sansio,websockets,direct-transport,direct",
                    help="uvicorn ws implementations, and the server's own frame writes on websockets-sansio "
                         "(newsstudio/server/ws_direct.py): direct (to the socket with the GIL released where the "
                         "transport has nothing queued, the default) or direct-transport (every byte via the transport)")
    ap.add_argument("--loops", default="uvloop", help="comma-separated uvicorn event loops: uvloop, asyncio")
    ap.add_argument("--messages", type=int, default=300)
    ap.add_argument("--size", type=int, default=3_499_200, help="bytes per message (two 1080x1080 NV12 frames)")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    for loop in args.loops.split(","):
        for impl in args.impls.split(","):
            for _ in range(args.repeat):
                gb, wall, cpu = measure(impl, args.messages, args.size, loop)
                print(f"{loop:8s} {impl:18s} {gb:.2f} GB in {wall:.2f} s ({gb / wall:.2f} GB/s), event-loop CPU {cpu:.2f} s "
                      f"= {cpu / gb:.2f} s per GB", flush=True)


if __name__ == "__main__":
    main()
