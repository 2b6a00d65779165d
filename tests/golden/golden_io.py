"""Discovery and comparison helpers for golden cases.

Cases are found by listing `$NEWSSTUDIO_GOLDEN_DIR/<engine>/` (default ../shared/golden) and
dispatched on the metadata field `kind`; every parameter comes from the case's own metadata so
the same tests pass on any other set of cases made the same way.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open

GOLDEN_DIR = Path(os.environ.get("NEWSSTUDIO_GOLDEN_DIR", Path(__file__).resolve().parents[2].parent / "shared" / "golden"))


def case_files(engine: str) -> list[Path]:
    d = GOLDEN_DIR / engine
    return sorted(d.glob("*.safetensors")) if d.is_dir() else []


def manifest_files(engine: str) -> list[Path]:
    d = GOLDEN_DIR / engine
    return sorted(p for p in d.glob("*.json") if "manifest" in p.name) if d.is_dir() else []


def load_case(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """All tensors of a case plus its metadata with every value JSON-decoded where possible."""
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        raw = f.metadata() or {}
    meta = {}
    for k, v in raw.items():
        try:
            meta[k] = json.loads(v)
        except (json.JSONDecodeError, TypeError):
            meta[k] = v
    return tensors, meta


def relerr(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖₂ / ‖ref‖₂ computed in float64 (0/0 counts as exact)."""
    o = out.detach().to("cpu", torch.float64).reshape(-1)
    r = ref.detach().to("cpu", torch.float64).reshape(-1)
    assert o.shape == r.shape, f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(o).all(), "output holds NaN/inf"
    den = r.norm().item()
    num = (o - r).norm().item()
    return num if den == 0 else num / den


def assert_close(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    assert tuple(out.shape) == tuple(ref.shape), f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    e = relerr(out, ref)
    assert e <= tol, f"{name}: relative error {e:.3e} > {tol:.1e}"


def assert_uint8_close(name: str, out, ref, max_abs: int, max_frac: float) -> None:
    """uint8 images: max |difference| and the fraction of values that differ at all."""
    o = torch.as_tensor(out).to(torch.int16)
    r = torch.as_tensor(ref).to(torch.int16)
    assert o.shape == r.shape, f"{name}: shape {tuple(o.shape)} != {tuple(r.shape)}"
    d = (o - r).abs()
    frac = (d > 0).float().mean().item()
    assert d.max().item() <= max_abs, f"{name}: max |diff| {d.max().item()} > {max_abs}"
    assert frac <= max_frac, f"{name}: {frac:.4%} of values differ > {max_frac:.4%}"
