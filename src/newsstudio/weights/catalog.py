"""What official weight files each neural engine needs, whether they are present, and fetching them.

Each engine's `weights` module owns its file list (`MODEL_FILES`, `missing_files`, `fetch`);
this module only gathers them for the `newsstudio weights check|fetch` commands.
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path

from ..engines.registry import models_dir

NEURAL_ENGINES = ("musetalk", "ditto")


def _module(engine: str):
    if engine not in NEURAL_ENGINES:
        raise ValueError(f"unknown engine {engine!r}; weights exist for {', '.join(NEURAL_ENGINES)}")
    return importlib.import_module(f"newsstudio.engines.{engine}.weights")


def check_all(models: str | os.PathLike[str] | None, echo: Callable[[str], None] = print) -> bool:
    """Print present/missing for every engine's files; True when at least one engine is complete."""
    root = models_dir(models)
    echo(f"models folder: {root.resolve()}")
    complete = False
    for engine in NEURAL_ENGINES:
        mod = _module(engine)
        files = list(mod.MODEL_FILES)
        missing = {f.local for f in mod.missing_files(root)}
        echo(f"\n{engine}:")
        for f in files:
            where = f.present(root)
            if where is not None:
                echo(f"  present  {f.local:<52} {f.purpose}")
            elif f.local in missing:
                echo(f"  MISSING  {f.local:<52} {f.purpose}")
        ok = not missing
        complete |= ok
        echo(f"  -> {'complete' if ok else f'{len(missing)} missing: newsstudio weights fetch {engine} --models {root}'}")
    if not complete:
        echo("\nNo neural engine is complete: the weight-free `classic` engine is used by default.")
    return complete


def fetch(engine: str, models: str | os.PathLike[str] | None, echo: Callable[[str], None] = print) -> list[Path]:
    root = models_dir(models)
    got = _module(engine).fetch(root)
    for p in got:
        echo(f"fetched {p}")
    echo(f"{engine}: {'nothing to fetch' if not got else f'{len(got)} files'} in {root}")
    return got
