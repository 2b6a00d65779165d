"""Keep MediaPipe's native log lines out of the terminal, and nothing else.

MediaPipe/TFLite write warnings straight to file descriptor 2 from their own worker threads,
at moments no Python code controls (so redirecting stderr around a call races with them). Once
a MediaPipe graph is created, fd 2 is routed through a pipe whose reader drops lines that look
like native log records (`W0000 00:00:... file.cc:123] ...`, TFLite's delegate banner) and
forwards everything else unchanged. At exit the pipe is drained and fd 2 restored, so Python
tracebacks and warnings still reach the user.
"""
from __future__ import annotations

import atexit
import os
import re
import threading

_NATIVE = re.compile(rb"^(?:[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w./-]+:\d+\]|INFO: Created TensorFlow Lite|WARNING: All log messages before absl::InitializeLog)")
_lock = threading.Lock()
_state: dict[str, object] = {}


def _ident(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def install() -> None:
    """Filter fd 2 from now on. Cheap to call often: when something else has re-pointed fd 2
    since (a test's output capture, a daemon's log file), the filter is set up again in front
    of the new target; the old reader saw end-of-file when its pipe lost fd 2 and has ended."""
    with _lock:
        if _state and _ident(2) == _state["pipe"]:
            return
        if _state:
            _release()
        try:
            saved = os.dup(2)
            r, w = os.pipe()
        except OSError:
            return
        pipe = _ident(w)
        os.dup2(w, 2)
        os.close(w)
        reader = threading.Thread(target=_pump, args=(r, saved), daemon=True, name="newsstudio-native-log")
        if not _state.get("atexit"):
            atexit.register(uninstall)
        _state.update(saved=saved, read=r, thread=reader, pipe=pipe, atexit=True)
        reader.start()


def _pump(r: int, out: int) -> None:
    buf = b""
    while True:
        try:
            chunk = os.read(r, 65536)
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if not _NATIVE.match(line):
                os.write(out, line + b"\n")
    if buf and not _NATIVE.match(buf):
        os.write(out, buf)


def uninstall() -> None:
    """Restore fd 2 and forward whatever is still in the pipe."""
    with _lock:
        if not _state or "saved" not in _state:
            return
        if _ident(2) == _state["pipe"]:
            os.dup2(_state["saved"], 2)  # closes the pipe's last write end: the reader sees EOF
        _release()


def _release() -> None:
    thread = _state.pop("thread")
    assert isinstance(thread, threading.Thread)
    thread.join(timeout=2.0)
    os.close(_state.pop("read"))  # type: ignore[arg-type]
    os.close(_state.pop("saved"))  # type: ignore[arg-type]
    _state.pop("pipe", None)
