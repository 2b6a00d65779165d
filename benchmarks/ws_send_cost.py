"""CPU a uvicorn WebSocket server spends per GB of binary messages it sends, per implementation.

Why: a live server sending raw NV12 chunks (1.75 MB per 1080x1080 frame, ~0.6 GB/s for 12 sessions
at 30 fps) spends that CPU on its event loop, under the GIL every other server thread needs. The
server runs in a child process (uvicorn, FastAPI, per-message deflate off as `newsstudio serve`
runs it); this process receives and measures the child's CPU time from /proc.

    python -m benchmarks.ws_send_cost --impls websockets-sansio,websockets --messages 300
"""
from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time

from .thread_cpu import process_cpu_s

SERVER = """
import sys, uvicorn
from fastapi import FastAPI, WebSocket
from newsstudio.server.ws_direct import DirectBinarySender
app = FastAPI()
payload = bytearray(int(sys.argv[3]))
direct = sys.argv[2] == "direct"
@app.websocket("/ws")
async def ws(w: WebSocket):
    await w.accept()
    sender = DirectBinarySender(w)
    if direct and not sender.direct:
        raise SystemExit("the direct sender does not apply to this connection")
    for _ in range(int(await w.receive_text())):
        if not (direct and await sender.send(payload)):
            await w.send_bytes(payload)
    await w.close()
impl = "websockets-sansio" if direct else sys.argv[2]
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), ws=impl, ws_per_message_deflate=False, log_level="warning")
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


def measure(impl: str, messages: int, size: int) -> tuple[float, float, float]:
    """(GB sent, wall s, server CPU s) for `messages` messages of `size` bytes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-c", SERVER, str(port), impl, str(size)])
    try:
        for _ in range(100):  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        asyncio.run(receive(port, 5))  # warm
        c0, t0 = process_cpu_s(p.pid), time.perf_counter()
        got = asyncio.run(receive(port, messages))
        return got / 1e9, time.perf_counter() - t0, process_cpu_s(p.pid) - c0
    finally:
        p.terminate()
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impls", default="websockets-sansio,websockets,direct",
                    help="uvicorn ws implementations, and direct: websockets-sansio with the server's own frame writes "
                         "(newsstudio/server/ws_direct.py)")
    ap.add_argument("--messages", type=int, default=300)
    ap.add_argument("--size", type=int, default=3_499_200, help="bytes per message (two 1080x1080 NV12 frames)")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    for impl in args.impls.split(","):
        for _ in range(args.repeat):
            gb, wall, cpu = measure(impl, args.messages, args.size)
            print(f"{impl:18s} {gb:.2f} GB in {wall:.2f} s ({gb / wall:.2f} GB/s), server CPU {cpu:.2f} s = {cpu / gb:.2f} s per GB")


if __name__ == "__main__":
    main()
