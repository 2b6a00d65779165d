"""Ditto settings: the official config pickle (read safely) and the documented defaults.

The release ships ``ditto_cfg/v0.4_hubert_cfg_pytorch.pkl``: a pickled dict with
``base_cfg`` (per-module model paths and devices), ``audio2motion_cfg`` (LMDM constructor
values: ``motion_feat_dim``, ``audio_feat_dim``, ``seq_frames``, ``use_emo``/``use_sc``/
``use_eye_open``/``use_eye_ball``, ``w2f_type``) and ``default_kwargs`` (what
``StreamSDK.setup`` merges under the caller's kwargs). That layout is read by
``core/atomic_components/cfg.py::parse_cfg`` of antgroup/ditto-talkinghead.

The pickle is *never* unpickled with the stock loader: :class:`SafeUnpickler` allows plain
containers, numpy arrays/dtypes/scalars and a few harmless builtins, and turns any other class
reference into an :class:`UnknownObject` (a dict of whatever state the pickle gave it, plus its
dotted name), so a config that references the release's own classes still loads and nothing in
it can run code. :func:`read_cfg_pickle` reports what it replaced.

Defaults (used when no pickle is found, and for every key the pickle does not set) are those
of ``StreamSDK.setup`` in ``stream_pipeline_online.py`` / ``stream_pipeline_offline.py`` of the
reference (commit e9191cf), except where noted:

* ``sampling_timesteps``: the reference default is 50; the engine's default is 4 DDIM steps
  (what the benchmark seed runs); pass ``steps=`` to change it. The pickle's value is kept in
  :attr:`DittoConfig.cfg_sampling_timesteps` and used when ``steps="cfg"``.
* ``delta_eye_open_n``: the reference default 0 means random blink gaps from Python's global
  ``random``; we keep the value but draw the gaps from a seeded ``random.Random(seed)`` so a
  stream is reproducible. Blinks only happen when the pickle provides ``delta_eye_arr``.
* ``online_mode``: the reference default is False (``inference.py`` with the PyTorch config runs
  the offline pipeline); ours is True: the engine always streams (the runner pushes PCM chunks)
  and uses the reference's online warm-up (``overlap_v2`` frames of silence features in front, d0
  from the first generated row), but output frame k always shows audio frame k (see
  ``engine``). False gives the offline semantics (no warm-up, d0 = the first audio frame's
  motion) - still streamed. The pickle's value is ignored (it is a property of how we run).
"""
from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

CFG_FILE = "ditto_cfg/v0.4_hubert_cfg_pytorch.pkl"
EMOTIONS = ("Angry", "Disgust", "Fear", "Happy", "Neutral", "Sad", "Surprise", "Contempt")

# ------------------------------------------------------------------------------- safe unpickling


class UnknownObject(dict):
    """Stand-in for an instance of a class the safe unpickler does not allow: a dict holding the
    state the pickle gave it (``__setstate__`` / ``__dict__`` / constructor args under ``args``)."""

    def __init__(self, class_name: str, args: tuple = ()) -> None:
        super().__init__()
        self.class_name = class_name
        if args:
            self["args"] = list(args)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and (state[0] is None or isinstance(state[0], dict)):
            state = {**(state[0] or {}), **(state[1] or {})}  # (dict, slots) form
        if isinstance(state, dict):
            self.update(state)
        else:
            self["state"] = state

    def __repr__(self) -> str:
        return f"UnknownObject({self.class_name}, {dict.__repr__(self)})"


def _unknown_class(name: str, seen: list[str]) -> type:
    def new(cls, *args: Any, **kwargs: Any) -> UnknownObject:  # called by REDUCE / NEWOBJ
        obj = UnknownObject(name, args)
        obj.update(kwargs)
        return obj

    if name not in seen:
        seen.append(name)
    return type(f"Unknown[{name}]", (), {"__new__": new, "__reduce__": None})


_ALLOWED: dict[tuple[str, str], Any] = {
    ("builtins", "dict"): dict, ("builtins", "list"): list, ("builtins", "tuple"): tuple,
    ("builtins", "set"): set, ("builtins", "frozenset"): frozenset, ("builtins", "slice"): slice,
    ("builtins", "range"): range, ("builtins", "complex"): complex, ("builtins", "bytearray"): bytearray,
    ("builtins", "bool"): bool, ("builtins", "int"): int, ("builtins", "float"): float, ("builtins", "str"): str,
    ("builtins", "bytes"): bytes, ("collections", "OrderedDict"): dict,
    ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
}
_NUMPY_RECONSTRUCT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                      ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
                      ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer")}


class SafeUnpickler(pickle.Unpickler):
    """Unpickler that never imports arbitrary code: allowed containers and numpy pieces only;
    every other class becomes an :class:`UnknownObject` factory (names collected in ``unknown``)."""

    def __init__(self, file: io.BufferedIOBase) -> None:
        super().__init__(file)
        self.unknown: list[str] = []

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if (module, name) in _NUMPY_RECONSTRUCT:
            mod = module.replace("numpy._core", "numpy.core") if not hasattr(np, "_core") else module
            import importlib

            return getattr(importlib.import_module(mod), name)
        if module == "numpy" and name in ("float32", "float64", "int64", "int32", "uint8", "bool_"):
            return getattr(np, name)
        return _unknown_class(f"{module}.{name}", self.unknown)


@dataclass
class CfgPickle:
    """What :func:`read_cfg_pickle` found."""

    path: Path
    data: dict[str, Any]
    unknown_classes: list[str]

    @property
    def base_cfg(self) -> dict[str, Any]:
        return dict(self.data.get("base_cfg") or {})

    @property
    def audio2motion_cfg(self) -> dict[str, Any]:
        return dict(self.data.get("audio2motion_cfg") or {})

    @property
    def default_kwargs(self) -> dict[str, Any]:
        return dict(self.data.get("default_kwargs") or {})


class DittoConfigError(ValueError):
    """The config pickle cannot be read or does not look like Ditto's."""


def read_cfg_pickle(path: str | Path, warn: bool = True) -> CfgPickle:
    """Read a Ditto config pickle without executing anything it references (see module doc)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            up = SafeUnpickler(f)
            data = up.load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError) as exc:
        raise DittoConfigError(f"{p}: cannot read the Ditto config pickle ({type(exc).__name__}: {exc})") from exc
    if not isinstance(data, Mapping):
        raise DittoConfigError(f"{p}: expected a dict at the top of the Ditto config pickle, got {type(data).__name__}")
    data = dict(data)
    missing = [k for k in ("audio2motion_cfg", "default_kwargs") if k not in data]
    if missing:
        raise DittoConfigError(f"{p}: not a Ditto config (no {', '.join(missing)}; keys: {sorted(map(str, data))[:8]})")
    if up.unknown and warn:
        print(f"ditto: {p.name} references classes that were not unpickled ({', '.join(up.unknown)}); "
              "their entries were read as plain dicts", file=sys.stderr)
    return CfgPickle(p, data, list(up.unknown))


# ------------------------------------------------------------------------------------- config


def emotion_vector(emo: Any) -> np.ndarray:
    """The condition handler's emotion rows [m, 8] (``_get_emo_avg`` / ``_parse_emo_seq``): an int
    label (0..7), a list of labels (mixed), a list of label lists (a sequence), or an array [m, 8]."""
    def avg(idx: Any) -> np.ndarray:
        v = np.zeros(8, np.float64)
        for i in (idx if isinstance(idx, (list, tuple)) else [idx]):
            v[int(i)] = 8
        e = np.exp(v - v.max())
        return (e / e.sum()).astype(np.float32)

    if isinstance(emo, np.ndarray) and emo.ndim == 2 and emo.shape[1] == 8:
        return emo.astype(np.float32)
    if isinstance(emo, (int, np.integer)) and 0 <= int(emo) < 8:
        return avg(int(emo))[None]
    if isinstance(emo, (list, tuple)) and emo and all(isinstance(i, (int, np.integer)) for i in emo) and len(emo) < 8:
        return avg(list(emo))[None]
    if isinstance(emo, (list, tuple)) and emo and all(isinstance(i, (list, tuple)) for i in emo):
        return np.stack([avg(list(i)) for i in emo])
    raise ValueError(f"unsupported emotion {emo!r}: an int 0..7 ({', '.join(EMOTIONS)}), a list of them, or [m, 8] rows")


#: The developer architecture of tests and ``--quick`` benchmarks (random weights only): 128 inputs
#: (256 crops), 2 HuBERT layers, image networks a quarter as wide. Every code path of the engine,
#: ~7x less warp + decoder work per frame on the CPU than full width at 128.
TINY_OPTIONS: dict[str, int] = {"input_size": 128, "hubert_layers": 2, "width_divisor": 4}


@dataclass(frozen=True)
class DittoConfig:
    """Every knob of the Ditto pipeline, with the reference's defaults (see the module doc)."""

    # LMDM (audio2motion_cfg)
    motion_feat_dim: int = 265
    audio_feat_dim: int = 1103
    seq_frames: int = 80
    use_emo: bool = True
    use_sc: bool = True
    use_eye_open: bool = True
    use_eye_ball: bool = True
    # registration (crop of the source)
    crop_scale: float = 2.3
    crop_vx_ratio: float = 0.0
    crop_vy_ratio: float = -0.125
    crop_flag_do_rot: bool = True
    smo_k_s: int = 13  # moving average over video frames of x_s_info (and of our crop params)
    # condition handler
    emo: Any = 4  # Neutral
    eye_f0_mode: bool = False
    # audio2motion
    overlap_v2: int = 10
    fix_kp_cond: int = 0
    fix_kp_cond_dim: tuple[int, int] | None = None
    steps: int = 4
    cfg_sampling_timesteps: int | None = None
    smo_k_d: int = 3
    online_mode: bool = True  # warm-up of overlap_v2 silence rows (online); False = the offline path
    # motion stitch
    use_d_keys: Any = None
    relative_d: bool = True
    drive_eye: bool | None = None
    delta_eye_arr: np.ndarray | None = field(default=None, compare=False)
    delta_eye_open_n: Any = 0
    fade_type: str = ""
    fade_out_keys: tuple[str, ...] = ("exp",)
    flag_stitching: bool = True
    overall_ctrl_info: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # audio features
    chunksize: tuple[int, int, int] = (3, 5, 2)
    # ours
    seed: int = 0  # DDIM noise and blink gaps of each stream
    input_size: int = 256  # network input (official 256; the crop is 2x this). Smaller = tests only
    hubert_layers: int | None = None  # random weights only: fewer HuBERT layers (tests only)
    width_divisor: int = 1  # random weights only: image networks' channels divided by this (tests only)
    source: str = "defaults"

    @property
    def crop_size(self) -> int:
        """Side of the registration crop and of the decoder output (512 officially)."""
        return 2 * self.input_size

    def emotion_rows(self) -> np.ndarray:
        return emotion_vector(self.emo)

    def fingerprint(self) -> dict[str, Any]:
        """What the prebaked arrays depend on (stored in the packet's engine meta)."""
        return {"crop_scale": self.crop_scale, "crop_vx_ratio": self.crop_vx_ratio, "crop_vy_ratio": self.crop_vy_ratio,
                "crop_flag_do_rot": bool(self.crop_flag_do_rot), "smo_k_s": self.smo_k_s, "input_size": self.input_size}

    def with_overrides(self, **kw: Any) -> "DittoConfig":
        names = {f.name for f in fields(self)}
        bad = [k for k in kw if k not in names]
        if bad:
            raise TypeError(f"unknown Ditto option(s): {', '.join(bad)} (known: {', '.join(sorted(names))})")
        if kw.get("steps") == "cfg":
            kw["steps"] = self.cfg_sampling_timesteps or 50
        cfg = replace(self, **kw)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.input_size % 128:
            raise ValueError(f"input_size must be a multiple of 128 (the warp network needs feature maps that are multiples of 32), got {self.input_size}")
        if int(self.width_divisor) < 1 or 32 % int(self.width_divisor):
            raise ValueError(f"width_divisor must divide 32 (1, 2, 4, 8, ...), got {self.width_divisor!r}")
        if not 0 <= self.overlap_v2 < self.seq_frames:
            raise ValueError(f"overlap_v2 must be in [0, {self.seq_frames}), got {self.overlap_v2}")
        if int(self.steps) < 1:
            raise ValueError(f"DDIM steps must be >= 1, got {self.steps}")
        if len(self.chunksize) != 3 or min(int(c) for c in self.chunksize) < 0 or int(self.chunksize[1]) < 1:
            raise ValueError(f"chunksize must be three frame counts (left, kept, look-ahead), got {self.chunksize}")
        self.emotion_rows()


_A2M_KEYS = ("motion_feat_dim", "audio_feat_dim", "seq_frames", "use_emo", "use_sc", "use_eye_open", "use_eye_ball")
_KWARG_KEYS = ("crop_scale", "crop_vx_ratio", "crop_vy_ratio", "crop_flag_do_rot", "smo_k_s", "emo", "eye_f0_mode",
               "overlap_v2", "fix_kp_cond", "fix_kp_cond_dim", "smo_k_d", "use_d_keys", "relative_d", "drive_eye",
               "delta_eye_arr", "delta_eye_open_n", "fade_type", "fade_out_keys", "flag_stitching", "overall_ctrl_info")


def config_from_pickle(cfg: CfgPickle) -> DittoConfig:
    """DittoConfig with the pickle's values where it sets them (unknown keys are ignored)."""
    kw: dict[str, Any] = {}
    a2m = cfg.audio2motion_cfg
    for k in _A2M_KEYS:
        if k in a2m:
            kw[k] = bool(a2m[k]) if k.startswith("use_") else int(a2m[k])
    dk = cfg.default_kwargs
    for k in _KWARG_KEYS:
        if k in dk and not isinstance(dk[k], UnknownObject):
            v = dk[k]
            if k == "delta_eye_arr" and v is not None:
                v = np.asarray(v, np.float32).reshape(-1, 63)
            if k == "fix_kp_cond_dim" and v is not None:
                v = tuple(int(x) for x in v)
            if k == "fade_out_keys":
                v = tuple(v)
            kw[k] = v
    if "sampling_timesteps" in dk:
        kw["cfg_sampling_timesteps"] = int(dk["sampling_timesteps"])
    kw["source"] = str(cfg.path)
    c = replace(DittoConfig(), **kw)
    c.validate()
    return c


def load_config(models_dir: str | Path | None, **overrides: Any) -> DittoConfig:
    """The pickle under ``models_dir`` (``ditto_cfg/v0.4_hubert_cfg_pytorch.pkl``) when present,
    else the defaults; then ``overrides`` (DittoConfig field names)."""
    base = DittoConfig()
    if models_dir is not None:
        p = Path(models_dir) / CFG_FILE
        if p.is_file():
            base = config_from_pickle(read_cfg_pickle(p))
    return base.with_overrides(**overrides) if overrides else base
