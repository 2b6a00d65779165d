"""benchmarks/norm_paths.py: as Dynamo traces the MuseTalk engine's render at a dynamic batch, every
4-D decoder norm takes the NHWC kernels (on an H100 with torch 2.11, 10 of 29 silently did not)."""
from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("variant", ["eager", "eager:rows104"])
def test_every_decoder_norm_takes_the_kernels_under_a_dynamic_batch(tmp_path, monkeypatch, variant):
    from benchmarks import norm_paths

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # kernel_fits on the CPU: Triton's interpreter
    out = tmp_path / "paths.json"
    assert norm_paths.main(["--device", "cpu", "--tiny", "--variants", variant, "--batch", "2", "--json", str(out)]) == 0
    v = json.loads(out.read_text())["variants"][variant]
    assert v["counts"]["kernel"] >= 10
    off_kernels = [n for n in v["norms"] if n["path"] == "fallback" and len(n["shape"]) == 4]
    assert off_kernels == []
