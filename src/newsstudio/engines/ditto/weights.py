"""Ditto weights: the official PyTorch release layout, strict loading, seeded random weights, fetching.

Official layout (the Hugging Face repository ``digital-avatar/ditto-talkinghead``, cloned or
downloaded under the models folder)::

    ditto_pytorch/models/appearance_extractor.pth   AppearanceFeatureExtractor (plain state_dict)
    ditto_pytorch/models/motion_extractor.pth       MotionExtractor (plain state_dict)
    ditto_pytorch/models/warp_network.pth           WarpingNetwork (plain state_dict)
    ditto_pytorch/models/decoder.pth                SPADEDecoder (spectral-norm keys)
    ditto_pytorch/models/stitch_network.pth         {'retarget_shoulder': DDP state_dict}
    ditto_pytorch/models/lmdm_v0.4_hubert.pth       {'model_state_dict': MotionDecoder}
    ditto_pytorch/aux_models/hubert_streaming_fix_kv.onnx   HuBERT audio encoder (ONNX, 6480 samples -> [20, 1024])
    ditto_cfg/v0.4_hubert_cfg_pytorch.pkl           pipeline config (read by ``config.read_cfg_pickle``)

The release's other ``aux_models`` (InsightFace detector/106 landmarks, landmark203, MediaPipe
face landmarker) are not needed: avatars get their landmarks at prebake (``avatar.landmarks``).

Every network is built with the official constructor arguments and loaded strictly after a
key/shape comparison that names the file (``checkpoints.load_state_dict_strict``); the decoder's
spectral norm is folded right after loading. ``build_random(salt)`` fills the same architectures
with ``fill_seeded_`` (so the values equal the golden generator's), and a seeded HuBERT-large
(transformers ``HubertModel``; hidden 1024, 24 layers, 16 heads, FFN 4096, conv feature extractor
with layer norm, stable layer norm) stands in for the ONNX encoder.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from newsstudio.weights.seeded import fill_seeded_

from ..musetalk.weights import ModelFile
from .checkpoints import (
    CheckpointSpec,
    DittoCheckpointError,
    load_ditto_module,
    load_state_dict_strict,
    read_checkpoint,
    register_ditto_module,
)
from .config import CFG_FILE, DittoConfig
from .models.lmdm import LMDM
from .models import AppearanceFeatureExtractor, MotionExtractor, SPADEDecoder, WarpingNetwork
from .models.stitching_network import StitchingNetwork, stitching_state_dict_from_checkpoint
from .wav2feat import HubertEncoder, onnx_hubert_encoder

REPO_ID = "digital-avatar/ditto-talkinghead"
FETCH_COMMAND = "newsstudio weights fetch ditto"
MODELS = "ditto_pytorch/models"
AUX = "ditto_pytorch/aux_models"
HUBERT_ONNX = f"{AUX}/hubert_streaming_fix_kv.onnx"
LMDM_FILE = "lmdm_v0.4_hubert.pth"
VERSIONS = ("pytorch",)


def _hub(local: str, purpose: str) -> ModelFile:
    return ModelFile(local, purpose, REPO_ID, local, versions=VERSIONS)


MODEL_FILES: tuple[ModelFile, ...] = (
    _hub(f"{MODELS}/appearance_extractor.pth", "appearance feature extractor (source -> 32x16x64x64 volume)"),
    _hub(f"{MODELS}/motion_extractor.pth", "motion extractor (pose, expression, keypoints)"),
    _hub(f"{MODELS}/warp_network.pth", "warping network (dense motion + 3D warp)"),
    _hub(f"{MODELS}/decoder.pth", "SPADE decoder (warped feature -> 512x512 RGB)"),
    _hub(f"{MODELS}/stitch_network.pth", "stitching MLP (keypoint correction)"),
    _hub(f"{MODELS}/{LMDM_FILE}", "LMDM motion diffusion transformer"),
    _hub(HUBERT_ONNX, "HuBERT audio encoder (ONNX)"),
    _hub(CFG_FILE, "pipeline config (LMDM sizes, default kwargs)"),
)

# HuBERT-large (transformers HubertConfig of facebook/hubert-large-*): what the ONNX encoder is.
HUBERT_LARGE_CONFIG: dict[str, Any] = {
    "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096,
    "feat_extract_norm": "layer", "conv_bias": True, "do_stable_layer_norm": True,
    "hidden_dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0, "feat_proj_dropout": 0.0,
    "layerdrop": 0.0, "apply_spec_augment": False,
}

register_ditto_module("StitchingNetwork", CheckpointSpec(StitchingNetwork, "stitch_network.pth", stitching_state_dict_from_checkpoint))


class DittoWeightsMissing(FileNotFoundError):
    """A file of the official layout is absent."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        super().__init__(f"Ditto {what} not found: {path} is missing. Get the official weights with `{FETCH_COMMAND}` "
                         f"(or `git clone https://huggingface.co/{REPO_ID} <models>`), or use --weights random for benchmarks.")


class DittoWeightsError(ValueError):
    """A weight file exists but cannot be used, or fetching failed."""


def model_files() -> list[ModelFile]:
    return list(MODEL_FILES)


def missing_files(models_dir: str | Path) -> list[ModelFile]:
    """The files of the official layout that are not in ``models_dir`` (empty = complete)."""
    d = Path(models_dir)
    return [f for f in MODEL_FILES if f.present(d) is None]


def fetch(models_dir: str | Path) -> list[Path]:
    """Download the missing files into ``models_dir`` from the Hugging Face Hub (PyTorch release only).
    Raises :class:`DittoWeightsError` with a clear message when the Hub cannot be reached."""
    d = Path(models_dir)
    got: list[Path] = []
    for f in missing_files(d):
        try:
            from huggingface_hub import hf_hub_download

            got.append(Path(hf_hub_download(f.repo_id, f.repo_path, local_dir=str(d / f.local_dir) if f.local_dir else str(d))))
        except Exception as exc:  # offline, no such file, permissions ...
            raise DittoWeightsError(
                f"could not download {f.repo_id}/{f.repo_path} to {d / f.local} ({type(exc).__name__}: {exc}). "
                "Check the network connection (or HF_ENDPOINT / a proxy), or copy the release folders "
                f"(ditto_pytorch/, ditto_cfg/) there by hand.") from exc
    return got


# ------------------------------------------------------------------------------------- models

Encoder = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class DittoModels:
    """Every network of the Ditto pipeline on one device. The image networks run in ``dtype``
    (float16 on CUDA, like the official autocast); LMDM and the stitching MLP in float32."""

    appearance: nn.Module
    motion: nn.Module
    warp: nn.Module
    decoder: nn.Module
    stitch: StitchingNetwork
    lmdm: LMDM
    hubert: Encoder
    hubert_kind: str  # "onnx" | "transformers" | "random"
    device: torch.device
    dtype: torch.dtype
    random_salt: int | None = None
    width_divisor: int = 1  # random weights only: the image networks' channels divided by this

    @property
    def is_random(self) -> bool:
        return self.random_salt is not None

    def feature_volume(self, input_size: int) -> tuple[int, int, int, int]:
        """The appearance feature f_s of one frame: (channels, depth, H, W) (32, 16, 64, 64 officially)."""
        app = self.appearance
        return (app.reshape_channel, app.reshape_depth, input_size // 4, input_size // 4)

    def weights_id(self) -> str:
        """Names the weights a prebaked packet was made with (a narrowed test architecture apart)."""
        if self.random_salt is None:
            return "official"
        return f"random:{self.random_salt}" + (f"/w{self.width_divisor}" if self.width_divisor > 1 else "")


def _image_nets(appearance: nn.Module, motion: nn.Module, warp: nn.Module, decoder: SPADEDecoder,
                device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, ...]:
    decoder.fold_spectral_norm_()  # in float32, before any cast (sigma from the stored u, v)
    return tuple(m.to(device=device, dtype=dtype).eval().requires_grad_(False) for m in (appearance, motion, warp, decoder))


def hubert_config(num_layers: int | None = None, **overrides: Any):
    from transformers import HubertConfig

    kw = dict(HUBERT_LARGE_CONFIG)
    if num_layers is not None:
        kw["num_hidden_layers"] = int(num_layers)
    kw.update(overrides)
    return HubertConfig(**kw)


def random_hubert(salt: int = 0, device: torch.device | str = "cpu", num_layers: int | None = None) -> HubertEncoder:
    """Seeded HuBERT-large (``num_layers`` < 24 only for tests), built on the meta device so the
    315M parameters are written once (by ``fill_seeded_``), float32, sdpa attention, eval."""
    from transformers import HubertModel

    cfg = hubert_config(num_layers)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = HubertModel(cfg)
    model = model.to_empty(device=device)
    for name, buf in model.named_buffers():
        raise RuntimeError(f"HubertModel has a buffer {name}; meta construction would leave it empty")
    fill_seeded_(model, salt)
    return HubertEncoder(model.eval().requires_grad_(False))


def random_lmdm(salt: int, cfg: DittoConfig, device: torch.device | str = "cpu") -> LMDM:
    lmdm = LMDM(cfg.motion_feat_dim, cfg.audio_feat_dim, cfg.seq_frames)
    fill_seeded_(lmdm.model, salt)  # the MotionDecoder (= the checkpoint's model_state_dict), not the schedule
    return lmdm.to(device).eval().requires_grad_(False)


def narrowed_image_nets(width_divisor: int) -> dict[str, dict[str, Any]]:
    """Constructor arguments of appearance, warp and decoder with every channel width divided by
    ``width_divisor`` (1: the official ones) and the dense-motion feature compressed to 1 channel
    instead of 4. The same layers, depths, kernels and feature-volume depth (16), so every code path
    of the engine runs; only the convolutions get cheaper (divisor 4 at 128 inputs: 32 GFLOP a frame
    by the flop counter, against ~310 for full width there: a quarter of its 1,234 at 256)."""
    d = int(width_divisor)  # validated with the config
    if d == 1:
        return {"appearance": {}, "warp": {}, "decoder": {}}
    return {
        "appearance": {"block_expansion": 64 // d, "max_features": 512 // d, "reshape_channel": 32 // d},
        "warp": {"block_expansion": 64 // d, "max_features": 512 // d, "reshape_channel": 32 // d,
                 "dense_motion": {"block_expansion": 32 // d, "max_features": 1024 // d, "compress": 1}},
        "decoder": {"block_expansion": 64 // d, "max_features": 512 // d, "out_channels": 64 // d,
                    "spade_hidden": 128 // d},
    }


def build_random(salt: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 config: DittoConfig | None = None, hubert_layers: int | None = None) -> DittoModels:
    """The official architectures with seeded random weights (``--weights random``).

    ``dtype`` applies to the image networks; ``hubert_layers`` and the config's ``width_divisor``
    (tests only) shrink HuBERT and the image networks."""
    cfg = config or DittoConfig()
    device = torch.device(device)
    arch = narrowed_image_nets(cfg.width_divisor)
    nets = _image_nets(fill_seeded_(AppearanceFeatureExtractor(**arch["appearance"]), salt),
                       fill_seeded_(MotionExtractor(), salt), fill_seeded_(WarpingNetwork(**arch["warp"]), salt),
                       fill_seeded_(SPADEDecoder(**arch["decoder"]), salt), device, dtype)
    stitch = fill_seeded_(StitchingNetwork(), salt).to(device).eval().requires_grad_(False)
    layers = hubert_layers if hubert_layers is not None else cfg.hubert_layers
    return DittoModels(*nets, stitch=stitch, lmdm=random_lmdm(salt, cfg, device),
                       hubert=random_hubert(salt, device, layers), hubert_kind="random", device=device, dtype=dtype,
                       random_salt=salt, width_divisor=int(cfg.width_divisor))


def _need(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DittoWeightsMissing(path, what)
    return path


def load_lmdm(path: str | Path, cfg: DittoConfig, device: torch.device | str = "cpu") -> LMDM:
    """``lmdm_v0.4_hubert.pth``: its ``model_state_dict`` strictly into the MotionDecoder."""
    p = Path(path)
    raw = read_checkpoint(p)
    if not isinstance(raw, dict) or "model_state_dict" not in raw:
        raise DittoCheckpointError(f"{p}: expected a dict with 'model_state_dict' (the LMDM checkpoint)")
    lmdm = LMDM(cfg.motion_feat_dim, cfg.audio_feat_dim, cfg.seq_frames)
    load_state_dict_strict(lmdm.model, raw["model_state_dict"], p)
    return lmdm.to(device).eval().requires_grad_(False)


def hubert_encoder(models_dir: str | Path, device: torch.device, hubert: str | Path | None = None) -> tuple[Encoder, str]:
    """The audio encoder: a transformers HuBERT folder when ``hubert`` is given, else the release's
    ONNX file through onnxruntime (CUDA provider when the engine runs on CUDA and it is available)."""
    if hubert is not None:
        return HubertEncoder.from_pretrained(hubert).to(device), "transformers"
    path = _need(Path(models_dir) / HUBERT_ONNX, "HuBERT encoder (ONNX)")
    try:
        import onnxruntime as ort

        avail = ort.get_available_providers()
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device.type == "cuda" and "CUDAExecutionProvider" in avail else ["CPUExecutionProvider"]
        enc = onnx_hubert_encoder(path, providers)
    except Exception as exc:
        raise DittoWeightsError(f"{path}: cannot open the HuBERT ONNX model ({type(exc).__name__}: {exc})") from exc

    def on_device(windows: torch.Tensor) -> torch.Tensor:
        return enc(windows).to(device)

    return on_device, "onnx"


def load_official(models_dir: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                  config: DittoConfig | None = None, hubert: str | Path | None = None) -> DittoModels:
    """Every network from the official layout, strictly loaded (clear errors naming the file)."""
    d = Path(models_dir)
    cfg = config or DittoConfig()
    device = torch.device(device)
    m = d / MODELS
    for f in ("appearance_extractor.pth", "motion_extractor.pth", "warp_network.pth", "decoder.pth", "stitch_network.pth", LMDM_FILE):
        _need(m / f, f"checkpoint {f}")
    nets = _image_nets(load_ditto_module("AppearanceFeatureExtractor", m), load_ditto_module("MotionExtractor", m),
                       load_ditto_module("WarpingNetwork", m), load_ditto_module("SPADEDecoder", m), device, dtype)
    stitch = load_ditto_module("StitchingNetwork", m).to(device).eval().requires_grad_(False)
    enc, kind = hubert_encoder(d, device, hubert)
    if cfg.source == "defaults":
        print(f"ditto: {d / CFG_FILE} not found; using the documented default settings", file=sys.stderr)
    return DittoModels(*nets, stitch=stitch, lmdm=load_lmdm(m / LMDM_FILE, cfg, device), hubert=enc,  # type: ignore[arg-type]
                       hubert_kind=kind, device=device, dtype=dtype)
