"""A stable on-disk cache for torch.compile, so a second process (or a carried cache folder)
skips Inductor's code generation: FX graph cache on, cache folder fixed.

Folder, first that is set: the `path` argument, $NEWSSTUDIO_INDUCTOR_CACHE, an existing
$TORCHINDUCTOR_CACHE_DIR, `~/.cache/newsstudio/inductor`.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "NEWSSTUDIO_INDUCTOR_CACHE"
DEFAULT = Path("~/.cache/newsstudio/inductor")

_configured: Path | None = None


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
    return d
