"""A stable on-disk cache for torch.compile, so a second process (or a carried cache folder)
skips Inductor's code generation: FX graph cache on, cache folder fixed.

Folder, first that is set: the `path` argument, $NEWSSTUDIO_INDUCTOR_CACHE, an existing
$TORCHINDUCTOR_CACHE_DIR, `~/.cache/newsstudio/inductor`.

Compile artifacts (one file, `serve --compile-artifacts FILE`): a fresh machine or container has
no cache folder, and MuseTalk's compile + capture took 186-311 s on the GPU hosts before a server
was ready. PyTorch's portable cache (`torch.compiler.save_cache_artifacts`: Inductor's graphs,
Triton kernels, autotuning results) is written to the file once the engines are warm and loaded
from it before the first compile of the next process. It is pickled data: load only files your
own servers wrote.
"""
from __future__ import annotations

import logging
import lzma
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "NEWSSTUDIO_INDUCTOR_CACHE"
ARTIFACTS_ENV = "NEWSSTUDIO_COMPILE_ARTIFACTS"
DEFAULT = Path("~/.cache/newsstudio/inductor")
ARTIFACTS_MAGIC = b"newsstudio compile artifacts 1\n"  # then PyTorch's serialised artifacts, xz-compressed

_configured: Path | None = None
_artifacts_loaded: set[Path] = set()


def compile_cache_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The folder `configure_compile_cache` would use (not created)."""
    for cand in (path, os.environ.get(ENV), os.environ.get("TORCHINDUCTOR_CACHE_DIR")):
        if cand:
            return Path(cand).expanduser()
    return DEFAULT.expanduser()


def configure_compile_cache(path: str | os.PathLike[str] | None = None) -> Path:
    """Set TORCHINDUCTOR_FX_GRAPH_CACHE=1 and TORCHINDUCTOR_CACHE_DIR (and the matching Inductor
    config flags, in case Inductor was imported already) before the first compile. Returns the
    folder. Idempotent; an explicit `path` replaces an earlier choice."""
    global _configured
    if _configured is not None and path is None:
        load_compile_artifacts()  # a file named since the folder was set (once per file)
        return _configured
    d = compile_cache_dir(path)
    d.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(d)
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
    os.environ.setdefault("TRITON_CACHE_DIR", str(d / "triton"))
    try:
        import torch._inductor.config as inductor_config

        inductor_config.fx_graph_cache = True
    except Exception:  # Inductor absent: eager only, nothing to cache
        pass
    _configured = d
    load_compile_artifacts()  # a named artifacts file, before the first compile (once)
    return d


def compile_artifacts_path() -> Path | None:
    """The compile-artifacts file this process uses ($NEWSSTUDIO_COMPILE_ARTIFACTS), or None."""
    p = os.environ.get(ARTIFACTS_ENV)
    return Path(p).expanduser() if p else None


def use_compile_artifacts(path: str | os.PathLike[str] | None) -> None:
    """Name the compile-artifacts file (kept in the environment, so worker processes see it too);
    None stops using one."""
    if path is None:
        os.environ.pop(ARTIFACTS_ENV, None)
    else:
        os.environ[ARTIFACTS_ENV] = str(Path(path).expanduser())


def load_compile_artifacts(path: str | os.PathLike[str] | None = None) -> int:
    """Load the artifacts file into the compile caches, once per process and file, before the first
    compile; the number of artifacts loaded. A missing file is the first run (0); an unusable one
    (not ours, truncated, from another PyTorch) is reported and compiling goes on from scratch."""
    p = Path(path).expanduser() if path is not None else compile_artifacts_path()
    if p is None or p in _artifacts_loaded:
        return 0
    _artifacts_loaded.add(p)
    if not p.is_file():
        log.info("no compile artifacts at %s yet: compiling; they are saved there once the engines are warm", p)
        return 0
    try:
        blob = p.read_bytes()
        if not blob.startswith(ARTIFACTS_MAGIC):
            raise ValueError("not a NewsStudio compile-artifacts file")
        import torch

        info = torch.compiler.load_cache_artifacts(lzma.decompress(blob[len(ARTIFACTS_MAGIC):]))
    except Exception as e:  # noqa: BLE001 - a bad cache costs compile time, never the server
        log.warning("compile artifacts %s are unusable (%s: %s); compiling from scratch", p, type(e).__name__, e)
        return 0
    n = sum(len(v) for v in info.artifacts.values()) if info is not None else 0
    log.info("compile artifacts: %d loaded from %s", n, p)
    return n


def save_compile_artifacts(path: str | os.PathLike[str] | None = None) -> int | None:
    """Write what this process compiled or loaded from its caches to the artifacts file (replaced
    whole: a reader never sees half a file); the bytes written, None without a file or anything
    compiled."""
    p = Path(path).expanduser() if path is not None else compile_artifacts_path()
    if p is None:
        return None
    import torch

    saved = torch.compiler.save_cache_artifacts()
    if saved is None or not saved[0]:
        return None
    blob = ARTIFACTS_MAGIC + lzma.compress(saved[0], preset=6)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=p.name + ".", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, p)
    except BaseException:
        os.unlink(tmp)
        raise
    log.info("compile artifacts: %d bytes saved to %s", len(blob), p)
    return len(blob)
