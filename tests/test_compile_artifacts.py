"""Compile artifacts (accel/cache.py, `serve --compile-artifacts`): what one process compiled, a fresh
process with an empty cache folder loads instead of compiling; a bad file costs compile time only."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from newsstudio.accel import cache

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys
from newsstudio.accel.cache import configure_compile_cache, save_compile_artifacts, use_compile_artifacts
use_compile_artifacts(sys.argv[2])
configure_compile_cache(sys.argv[1])  # a fresh cache folder per process: nothing on disk to hit
import torch
from torch._dynamo.utils import counters

@torch.compile
def f(x):
    return torch.nn.functional.gelu(x * 2 + 1).sum(1)

x = torch.randn(16, 16)
assert torch.allclose(f(x), torch.nn.functional.gelu(x * 2 + 1).sum(1), atol=1e-5)
saved = save_compile_artifacts() if sys.argv[3] == "save" else None
print(json.dumps({"inductor": dict(counters["inductor"]), "saved": saved}))
"""


def _child(tmp_path: Path, name: str, artifacts: Path, save: bool) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / name), str(artifacts), "save" if save else "-"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fresh_process_loads_what_another_compiled_instead_of_compiling(tmp_path):
    artifacts = tmp_path / "artifacts.bin"
    first = _child(tmp_path, "cache1", artifacts, save=True)
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 1 and first["saved"] == artifacts.stat().st_size > 0
    assert artifacts.read_bytes().startswith(cache.ARTIFACTS_MAGIC)
    second = _child(tmp_path, "cache2", artifacts, save=False)  # another empty cache folder: only the file can hit
    assert second["inductor"].get("fxgraph_cache_hit", 0) >= 1 and second["inductor"].get("fxgraph_cache_miss", 0) == 0
    assert not list(tmp_path.glob("artifacts.bin.*.tmp"))  # written whole, no leftovers


@pytest.mark.parametrize("content", [b"", b"not ours at all", cache.ARTIFACTS_MAGIC + b"\xfd7zXZ truncated"],
                         ids=["empty", "foreign", "truncated"])
def test_an_unusable_artifacts_file_is_reported_and_compiling_goes_on(tmp_path, caplog, content):
    bad = tmp_path / "artifacts.bin"
    bad.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="newsstudio.accel.cache"):
        assert cache.load_compile_artifacts(bad) == 0
    assert f"compile artifacts {bad} are unusable" in caplog.text and "compiling from scratch" in caplog.text
    assert bad.read_bytes() == content  # left as it was: the next save replaces it whole
    assert cache.load_compile_artifacts(bad) == 0  # once per process and file: not reported again
    assert caplog.text.count("are unusable") == 1


def test_a_missing_file_is_the_first_run_and_nothing_is_written_without_a_name(tmp_path, monkeypatch):
    monkeypatch.delenv(cache.ARTIFACTS_ENV, raising=False)
    assert cache.load_compile_artifacts(tmp_path / "none_yet.bin") == 0
    assert cache.save_compile_artifacts() is None and cache.compile_artifacts_path() is None


def test_the_server_names_its_artifacts_file_before_any_engine_compiles(tmp_path, monkeypatch):
    from newsstudio.server.state import ServerConfig, ServerState

    monkeypatch.delenv(cache.ARTIFACTS_ENV, raising=False)
    state = ServerState(ServerConfig(engine="classic", device="cpu", avatars=tmp_path / "avatars",
                                     compile_artifacts=tmp_path / "kernels.bin"))
    try:
        assert cache.compile_artifacts_path() == tmp_path / "kernels.bin"
    finally:
        state.close()
        monkeypatch.delenv(cache.ARTIFACTS_ENV, raising=False)


def test_a_file_named_after_the_cache_folder_was_set_is_still_loaded_before_the_next_compile(tmp_path, caplog, monkeypatch):
    """The server names its file at start-up; an engine built earlier in the process may have set the
    cache folder already: the next compile's `configure_compile_cache` still loads the file."""
    monkeypatch.delenv(cache.ARTIFACTS_ENV, raising=False)
    for k in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(k, raising=False)
    cache.configure_compile_cache(tmp_path / "folder")
    late = tmp_path / "late.bin"
    late.write_bytes(b"written by something else")
    cache.use_compile_artifacts(late)
    with caplog.at_level(logging.WARNING, logger="newsstudio.accel.cache"):
        cache.configure_compile_cache()
    assert f"compile artifacts {late} are unusable" in caplog.text
