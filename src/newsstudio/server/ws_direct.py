"""Binary WebSocket messages written to the connection's transport as they are: no copy under the GIL.

Why: a live server sending raw NV12 chunks (7 MB for four 1080x1080 frames; ~0.8 GB/s for 16
sessions at 30 fps) spent ~0.6 s of event-loop CPU per GB through `WebSocket.send_bytes`
(benchmarks/ws_send_cost.py): the websockets protocol serialises each frame into a new buffer,
header and payload copied together, all with the GIL held, which every other server thread waits
for (at 16 MuseTalk sessions on an H100 each thread waited ~1.1 ms median for the GIL after each
torch call: benchmarks/RESULTS.md, thirty-first session). Writing the frame's few header bytes and
then a view of the payload to the transport leaves the one copy the kernel makes.

Only where it is safe: uvicorn's websockets-sansio protocol (what ``newsstudio serve`` runs), the
connection open, no extension negotiated (``serve`` turns per-message deflate off: a compressed
connection needs the protocol's own framing) and no fragmented message under way. Anything else,
and every failure case (a closing or closed connection), goes through ``send_bytes``, which raises
what it always raised. The flow control is uvicorn's: wait while its transport is paused.

The kernel's copy itself runs without the GIL: where the transport has nothing queued, header and
payload go to the socket in one ``os.writev`` (which releases the GIL), and only what the socket
does not take is handed to the transport. Why: uvicorn runs on uvloop where it is installed
(``uvicorn[standard]``, and the GPU machines), and uvloop's ``transport.write`` makes its first
attempt at the socket with the GIL held: py-spy (``--gil``) found the event loop holding the GIL
there 0.16 of the wall time at 16 MuseTalk sessions (~1.3 ms per 7 MB chunk; benchmarks/RESULTS.md,
thirty-ninth session), time every render and speech thread waited through.
"""
from __future__ import annotations

import os
from typing import Any

OP_BINARY_FIN = 0x82  # FIN + binary opcode; a server's frames are not masked (RFC 6455 5.1)


def frame_header(size: int) -> bytes:
    """The header of one unmasked, final binary frame of ``size`` payload bytes (RFC 6455 5.2)."""
    if size < 0:
        raise ValueError(f"payload size must be >= 0, got {size}")
    if size < 126:
        return bytes((OP_BINARY_FIN, size))
    if size < 1 << 16:
        return bytes((OP_BINARY_FIN, 126)) + size.to_bytes(2, "big")
    return bytes((OP_BINARY_FIN, 127)) + size.to_bytes(8, "big")


def _sansio_protocol(ws: Any) -> Any | None:
    """uvicorn's websockets-sansio protocol behind a Starlette WebSocket, or None (another server or
    implementation). Starlette wraps the server's ``send`` in closures of its exception handling
    (which act on HTTP responses only); the protocol is the ``__self__`` of the bound method inside."""
    try:
        from websockets.protocol import Protocol
    except ImportError:
        return None
    needed = ("transport", "writable", "disconnected", "close_sent")
    todo, seen = [getattr(ws, "_send", None)], 0
    while todo and seen < 8:
        fn = todo.pop()
        seen += 1
        proto = getattr(fn, "__self__", None)
        if isinstance(getattr(proto, "conn", None), Protocol) and all(hasattr(proto, a) for a in needed):
            return proto
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                inner = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(inner):
                todo.append(inner)
    return None


def _plain_socket_fd(transport: Any) -> int | None:
    """The file descriptor of the transport's socket where bytes written to it reach the peer as they
    are (no TLS layer in between), else None (also where the OS has no ``writev``: Windows)."""
    if not hasattr(os, "writev"):
        return None
    if transport.get_extra_info("sslcontext") is not None or transport.get_extra_info("ssl_object") is not None:
        return None
    sock = transport.get_extra_info("socket")
    try:
        fd = sock.fileno() if sock is not None else -1
    except (AttributeError, OSError):
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


class DirectBinarySender:
    """``await sender.send(payload)``: True when the payload went out as one binary frame written
    straight to the transport, False when the caller must send it with ``send_bytes`` (see the
    module doc). ``direct`` says whether the connection allows the direct path at all."""

    def __init__(self, ws: Any, socket_writes: bool = True) -> None:
        self._proto = _sansio_protocol(ws)
        self._fd = _plain_socket_fd(self._proto.transport) if self._proto is not None and socket_writes else None
        self.sent = 0  # messages written directly (tests, metrics)
        self.socket_bytes = 0  # of their bytes: written to the socket without the GIL
        self.queued_bytes = 0  # the rest: handed to the transport (the socket was full or it had a queue)

    @property
    def direct(self) -> bool:
        return self._proto is not None

    async def send(self, payload: bytes | bytearray | memoryview) -> bool:
        p = self._proto
        if p is None:
            return False
        await p.writable.wait()  # uvicorn's flow control: paused while the socket's buffer is full
        from websockets.protocol import State

        conn = p.conn
        if (p.disconnected or p.close_sent or p.transport.is_closing() or conn.state is not State.OPEN
                or conn.expect_continuation_frame or getattr(conn, "extensions", None)):
            return False
        view = memoryview(payload).cast("B")
        header = frame_header(view.nbytes)
        written = self._write_to_socket(p.transport, header, view)
        # what the socket did not take goes to the transport, in order, without an await in between: one frame
        if written < len(header):
            p.transport.write(header[written:])
            p.transport.write(view)
        elif written < len(header) + view.nbytes:
            p.transport.write(view[written - len(header):])
        self.socket_bytes += written
        self.queued_bytes += len(header) + view.nbytes - written
        self.sent += 1
        return True

    def _write_to_socket(self, transport: Any, header: bytes, view: memoryview) -> int:
        """Bytes of header + payload the socket took at once: 0 where socket writes are off, where the
        transport still holds bytes (written here they would overtake them), when the socket is full
        or on an error (which the transport then meets and reports its own way)."""
        if self._fd is None or transport.get_write_buffer_size():
            return 0
        try:
            return os.writev(self._fd, (header, view))  # the kernel's copy runs with the GIL released
        except OSError:  # BlockingIOError (full), InterruptedError, a reset or closed peer
            return 0
