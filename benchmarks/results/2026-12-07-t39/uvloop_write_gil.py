"""Probe (thirty-ninth session): does an event loop's ``transport.write`` of a 7 MB buffer hold the GIL?

Writes a 7 MB memoryview to a loopback TCP socket 120 times a second (a thread drains the other end)
for SECONDS (default 6) on LOOP (``uvloop`` or ``asyncio``). Sample it with py-spy while it runs:

    LOOP=uvloop python uvloop_write_gil.py & sleep 1.5
    py-spy record --nonblocking --threads --gil -r 100 -d 4 -f raw -o prof.txt --pid $!
    grep -c 'uvloop_write_gil.py:WRITE_LINE' prof.txt   # samples holding the GIL at the write line

On the dev machine (Python 3.11, uvloop 0.23), idle: uvloop 44-48 of 400 samples at the write line,
asyncio 3-13 (stacks through the line, its own Python `write` included).
"""
import asyncio
import os
import socket
import threading
import time

PAYLOAD = bytearray(7_000_000)


def drain(sock: socket.socket) -> None:
    buf = bytearray(8 << 20)
    while sock.recv_into(buf):
        pass


async def main(seconds: float, rate: float) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    threading.Thread(target=drain, args=(cli,), daemon=True).start()
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(asyncio.Protocol, conn)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        transport.write(memoryview(PAYLOAD))  # WRITE_LINE
        await asyncio.sleep(1 / rate)


if __name__ == "__main__":
    run = asyncio.run
    if os.environ.get("LOOP", "uvloop") == "uvloop":
        import uvloop

        run = uvloop.run
    run(main(float(os.environ.get("SECONDS", 6)), 120.0))
