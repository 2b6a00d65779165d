"""Collects per-kind golden checkers from tests/golden/checks_<engine>_*.py modules.

Each such module defines `CHECKS: dict[str, Callable[[tensors, meta], None]]`, keyed by the
case metadata field `kind`. A case whose kind no module handles fails (it is never skipped).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

Checker = Callable[[dict, dict], None]


def checkers(engine: str) -> dict[str, Checker]:
    found: dict[str, Checker] = {}
    for path in sorted(Path(__file__).parent.glob(f"checks_{engine}_*.py")):
        mod = importlib.import_module(f"golden.{path.stem}")
        for kind, fn in mod.CHECKS.items():
            assert kind not in found, f"kind {kind!r} handled twice ({path.name})"
            found[kind] = fn
    return found


def run_case(engine: str, path: Path) -> None:
    """Load one case file and run the checker registered for its `kind` (missing = failure)."""
    from golden.golden_io import load_case

    tensors, meta = load_case(path)
    kind = meta.get("kind")
    check = checkers(engine).get(kind)
    assert check is not None, f"{path.name}: no checker for kind {kind!r}"
    check(tensors, meta)
