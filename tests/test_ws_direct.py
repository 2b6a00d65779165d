"""Chunks written straight to the WebSocket transport (server/ws_direct.py): a real uvicorn server on
loopback and a real websockets client must see exactly the messages `send_bytes` would have sent."""
from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
from fastapi import FastAPI, WebSocket
from fastapi.testclient import TestClient
from websockets.frames import Frame, Opcode

from newsstudio.server.ws_direct import DirectBinarySender, frame_header
from tests.test_server import ServerThread

SIZES = [0, 1, 125, 126, 65535, 65536, 3 * 1080 * 1080 // 2]  # each length encoding of RFC 6455, and an NV12 frame


@pytest.mark.parametrize("size", SIZES)
def test_the_header_is_the_one_websockets_writes(size):
    payload = os.urandom(size)
    assert frame_header(size) + payload == Frame(Opcode.BINARY, payload).serialize(mask=False)


def _app(report: dict, sizes: list[int] = SIZES, socket_writes: bool = True) -> FastAPI:
    app = FastAPI()

    @app.websocket("/ws")
    async def ws(w: WebSocket) -> None:
        await w.accept()
        sender = DirectBinarySender(w, socket_writes=socket_writes)
        report["direct"] = sender.direct
        for i, size in enumerate(sizes):
            payload = bytearray(os.urandom(size))
            if i % 2:  # what `_pack` makes: a view of an uninitialised numpy buffer, filled in
                payload = memoryview(np.frombuffer(payload, np.uint8).copy())
            report.setdefault("sent", []).append(bytes(payload))
            if not await sender.send(payload):
                await w.send_bytes(payload)
        await w.send_text("done")  # text frames still go through the protocol, in order after the direct ones
        report["direct_sent"] = sender.sent
        report["socket_bytes"], report["queued_bytes"] = sender.socket_bytes, sender.queued_bytes
        await w.close()

    return app


def _read_all(app: FastAPI, **config) -> list:
    from websockets.asyncio.client import connect

    with ServerThread(app, **config) as server:
        async def read() -> list:
            got = []
            async with connect(server.ws_url + "/ws", max_size=None) as c:
                async for msg in c:
                    got.append(msg)
            return got

        return asyncio.run(read())


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_uvicorn_server_sends_binary_messages_directly_and_the_client_reads_them_unchanged(loop):
    report: dict = {}
    got = _read_all(_app(report), loop=loop)
    assert report["direct"] and report["direct_sent"] == len(SIZES)  # the direct path, every time
    assert got[:-1] == report["sent"] and got[-1] == "done"
    assert report["socket_bytes"] > 0  # written by the GIL-free path, not only handed to the transport


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_messages_larger_than_the_socket_takes_continue_through_the_transport_in_order(loop):
    """A burst the kernel's buffer cannot hold at once (a 24 MB message, then smaller ones while the
    rest is still queued): part goes to the socket, the rest through the transport, and the client
    reads every message whole and in order."""
    sizes = [24 << 20, 3 * 1080 * 1080 // 2, 5, 24 << 20, 70_000]
    report: dict = {}
    got = _read_all(_app(report, sizes), loop=loop)
    assert report["direct_sent"] == len(sizes)
    assert [len(m) for m in got[:-1]] == sizes and got[:-1] == report["sent"] and got[-1] == "done"
    assert report["socket_bytes"] > 0 and report["queued_bytes"] > 0  # both paths carried bytes


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_binary_message_never_overtakes_bytes_the_transport_still_holds(loop):
    """The transport's flow control set never to pause: after a message the socket could not take
    whole, the next ones are sent while the transport still holds its rest and the client drains the
    socket meanwhile. Each must wait its turn behind the held bytes; the client reads every message
    whole and in order."""
    sizes = [24 << 20] + [70_000] * 300
    app = FastAPI()

    @app.websocket("/ws")
    async def ws(w: WebSocket) -> None:
        await w.accept()
        sender = DirectBinarySender(w)
        sender._proto.transport.set_write_buffer_limits(high=1 << 30)  # never paused: no wait between sends
        for i, size in enumerate(sizes):
            assert await sender.send(bytes([i % 251]) * size)
        await w.close()

    got = _read_all(app, loop=loop)
    assert [len(m) for m in got] == sizes and all(m == bytes([i % 251]) * len(m) for i, m in enumerate(got))


def test_with_socket_writes_off_every_byte_goes_through_the_transport():
    """ServerConfig.ws_socket_writes=False: still one direct frame per message, none of it written
    to the socket here (the A/B baseline of benchmarks.load_test --ws-socket-writes)."""
    report: dict = {}
    got = _read_all(_app(report, socket_writes=False))
    assert report["direct_sent"] == len(SIZES) and got[:-1] == report["sent"]
    assert report["socket_bytes"] == 0 and report["queued_bytes"] == sum(len(frame_header(n)) + n for n in SIZES)


def test_other_servers_take_the_ordinary_path():
    """Starlette's test client is no uvicorn protocol: the sender declines and `send_bytes` sends."""
    report: dict = {}
    with TestClient(_app(report)).websocket_connect("/ws") as c:
        got = [c.receive_bytes() for _ in SIZES]
        assert c.receive_text() == "done"
    assert report["direct"] is False and report["direct_sent"] == 0
    assert got == report["sent"]


def test_a_chunks_frames_adjacent_in_memory_are_packed_as_one_run_with_the_same_bytes():
    """`server.ws._pack`: frames that are consecutive rows of one host tensor (a request's copy-out)
    are copied as one run; the message is byte for byte the one packed frame by frame."""
    import torch

    from newsstudio.server.ws import _adjacent_runs, _pack

    host = torch.randint(0, 256, (6, 9, 8), dtype=torch.uint8)
    audio = os.urandom(40)
    header = {"type": "chunk", "frame_bytes": [72] * 4}
    frames = list(host[1:5])  # four adjacent frames
    assert len(_adjacent_runs(tuple(frames))) == 1
    assert _pack(header, *frames, audio) == _pack(header, *[f.clone() for f in frames], audio)
    gaps = [host[0], host[2], host[3], host[5]]  # 2-3 adjacent, the others not
    assert len(_adjacent_runs(tuple(gaps))) == 3
    assert _pack(header, *gaps, audio) == _pack(header, *[f.clone() for f in gaps], audio)
    floats = torch.rand(3, 5)  # another dtype: runs are counted in bytes
    assert _pack(header, *floats, audio) == _pack(header, *[f.clone() for f in floats], audio)
    strided = host[:, :, ::2]  # not contiguous: copied alone
    assert _pack(header, *strided, audio) == _pack(header, *[f.contiguous() for f in strided], audio)
