"""Strict loading of the official Ditto image-network checkpoints (`ditto_pytorch/models/*.pth`).

The four image networks ship as plain state_dicts and are built with constructor defaults, exactly
like the official loader (`core/utils/load_model.py`). We check keys and shapes ourselves before
`load_state_dict(strict=True)` so that a wrong or corrupted file fails with an error naming the file
and listing what differs, instead of a long PyTorch traceback.

    from newsstudio.engines.ditto.checkpoints import load_ditto_module
    decoder = load_ditto_module("SPADEDecoder", "weights/ditto_pytorch/models")  # folder or .pth
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .models import AppearanceFeatureExtractor, MotionExtractor, SPADEDecoder, WarpingNetwork

StateDict = Mapping[str, torch.Tensor]


class DittoCheckpointError(ValueError):
    """A checkpoint file does not fit the module it is loaded into."""


def _plain_state_dict(obj: object) -> StateDict:
    return obj  # type: ignore[return-value]


@dataclass(frozen=True)
class CheckpointSpec:
    """How one official module is built and where its weights live in a checkpoint file."""

    factory: Callable[[], nn.Module]
    filename: str  # under ditto_pytorch/models/
    extract: Callable[[object], StateDict] = field(default=_plain_state_dict)


_SPECS: dict[str, CheckpointSpec] = {
    "AppearanceFeatureExtractor": CheckpointSpec(AppearanceFeatureExtractor, "appearance_extractor.pth"),
    "MotionExtractor": CheckpointSpec(MotionExtractor, "motion_extractor.pth"),
    "WarpingNetwork": CheckpointSpec(WarpingNetwork, "warp_network.pth"),
    "SPADEDecoder": CheckpointSpec(SPADEDecoder, "decoder.pth"),
}


def register_ditto_module(name: str, spec: CheckpointSpec) -> None:
    """Make another official module loadable by `load_ditto_module` (e.g. one whose checkpoint
    wraps the state_dict: give an `extract` that returns it)."""
    _SPECS[name] = spec


def registered_modules() -> dict[str, CheckpointSpec]:
    return dict(_SPECS)


def _resolve(name_or_class: str | type[nn.Module]) -> tuple[str, CheckpointSpec]:
    if isinstance(name_or_class, type):
        for name, spec in _SPECS.items():
            if spec.factory is name_or_class:
                return name, spec
        # An unregistered class: built with defaults, plain state_dict, no default file name.
        return name_or_class.__name__, CheckpointSpec(name_or_class, "")
    wanted = name_or_class.lower().removesuffix(".pth")
    for name, spec in _SPECS.items():
        if wanted in (name.lower(), spec.filename.lower().removesuffix(".pth")):
            return name, spec
    known = ", ".join(f"{n} ({s.filename})" for n, s in _SPECS.items())
    raise KeyError(f"unknown Ditto module {name_or_class!r}; known: {known}")


def checkpoint_path(path: str | Path, filename: str) -> Path:
    """`path` itself if it is a file; otherwise `filename` inside it (also looked up under
    `ditto_pytorch/models/`, the layout of the official release)."""
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir() and filename:
        for cand in (p / filename, p / "ditto_pytorch" / "models" / filename, p / "models" / filename):
            if cand.is_file():
                return cand
        raise FileNotFoundError(f"Ditto checkpoint {filename!r} not found in {p} (nor under ditto_pytorch/models/)")
    raise FileNotFoundError(f"Ditto checkpoint {p} does not exist")


def read_checkpoint(path: str | Path) -> object:
    """torch.load on CPU, tensors only (no arbitrary pickled code)."""
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # unreadable / truncated / not a torch file
        raise DittoCheckpointError(f"{path}: cannot read checkpoint ({type(exc).__name__}: {exc})") from exc


def state_dict_mismatches(module: nn.Module, state_dict: StateDict, limit: int = 8) -> list[str]:
    """Human-readable differences between a module's state_dict and a loaded one (empty = fits)."""
    ours = module.state_dict()
    problems: list[str] = []
    missing = [k for k in ours if k not in state_dict]
    unexpected = [k for k in state_dict if k not in ours]
    bad_shape = [
        f"{k}: file {tuple(state_dict[k].shape)} vs module {tuple(ours[k].shape)}"
        for k in ours
        if k in state_dict and (not isinstance(state_dict[k], torch.Tensor) or state_dict[k].shape != ours[k].shape)
    ]
    for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", bad_shape)):
        if items:
            more = f" ... (+{len(items) - limit} more)" if len(items) > limit else ""
            problems.append(f"{len(items)} {label}: {', '.join(items[:limit])}{more}")
    return problems


def load_state_dict_strict(module: nn.Module, state_dict: object, source: str | Path) -> nn.Module:
    """Strict load with a clear error naming `source` when keys or shapes differ."""
    if not isinstance(state_dict, Mapping) or not all(isinstance(k, str) for k in state_dict):
        raise DittoCheckpointError(f"{source}: expected a state_dict (mapping name -> tensor), got {type(state_dict).__name__}")
    problems = state_dict_mismatches(module, state_dict)
    if problems:
        raise DittoCheckpointError(
            f"{source} does not fit {type(module).__name__} (strict load): " + "; ".join(problems))
    module.load_state_dict(state_dict, strict=True)
    return module


def load_ditto_module(
    name_or_class: str | type[nn.Module],
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """Build an official Ditto module with its constructor defaults, load its checkpoint strictly,
    move it to `device` (and floating-point `dtype` if given) and put it in eval mode.

    `name_or_class`: class or class name ("SPADEDecoder") or checkpoint stem ("decoder").
    `path`: the .pth file, or a folder holding it (the release root or its ditto_pytorch/models).
    """
    name, spec = _resolve(name_or_class)
    file = checkpoint_path(path, spec.filename)
    module = spec.factory()
    raw = read_checkpoint(file)
    try:
        sd = spec.extract(raw)
    except (KeyError, TypeError) as exc:
        raise DittoCheckpointError(f"{file}: no {name} weights in this checkpoint ({exc})") from exc
    load_state_dict_strict(module, sd, file)
    module.to(device=device)
    if dtype is not None:
        module.to(dtype=dtype)
    return module.eval()
