"""MuseTalk weights: the official folder layout, strict loading, seeded random weights, fetching.

Official layout (what `download_weights.sh` of TMElyralab/MuseTalk produces under `models/`)::

    musetalkV15/musetalk.json  musetalkV15/unet.pth          (v1.5 UNet, the default)
    musetalk/musetalk.json     musetalk/pytorch_model.bin    (v1.0 UNet, same architecture)
    sd-vae/config.json         sd-vae/diffusion_pytorch_model.bin   (stabilityai/sd-vae-ft-mse)
    whisper/config.json        whisper/pytorch_model.bin     (openai/whisper-tiny; keys `model.encoder.*`)
    face-parse-bisent/79999_iter.pth, resnet18-5c106cde.pth  (BiSeNet, for blending)

Every network is built from its config and loaded with `load_state_dict(strict=True)` after a
key/shape comparison that names the file and what differs. Nothing here touches the network:
configs are read from the folder, not the Hub. `fetch()` is the only function that downloads.

`build_random(salt)` builds the same architectures filled with `fill_seeded_` under the official
key names (the Whisper encoder under `encoder.*`, exactly as filling the whole `WhisperModel`
does, since every value depends only on its key), which reproduces the golden vectors.
"""
from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from newsstudio.weights.seeded import fill_seeded_

from .audio_features import PositionalEncoding
from .unet import build_unet, load_unet_config
from .vae import build_vae, load_vae_config

FETCH_COMMAND = "newsstudio weights fetch musetalk"
VERSIONS = ("v15", "v10")

# Architecture facts (not weights): the release's musetalk.json, sd-vae-ft-mse's config.json and
# openai/whisper-tiny's encoder hyper-parameters. `build_random` uses them when no folder is given.
UNET_CONFIG: dict[str, Any] = {
    "act_fn": "silu", "attention_head_dim": 8, "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False, "cross_attention_dim": 384,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 8, "layers_per_block": 2,
    "mid_block_scale_factor": 1, "norm_eps": 1e-05, "norm_num_groups": 32, "out_channels": 4, "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
}
VAE_CONFIG: dict[str, Any] = {
    "act_fn": "silu", "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
    "in_channels": 3, "out_channels": 3, "latent_channels": 4, "layers_per_block": 2, "norm_num_groups": 32,
    "sample_size": 256,
}
WHISPER_TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 51865, "num_mel_bins": 80, "d_model": 384, "encoder_layers": 4, "encoder_attention_heads": 6,
    "encoder_ffn_dim": 1536, "decoder_layers": 4, "decoder_attention_heads": 6, "decoder_ffn_dim": 1536,
    "max_source_positions": 1500, "max_target_positions": 448, "activation_function": "gelu",
    "scale_embedding": False,
}


# --------------------------------------------------------------------------------------------
# What the release consists of
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelFile:
    """One file of the official layout: where it goes and where it comes from."""

    local: str  # path under the models folder (first choice; `alternatives` also accepted)
    purpose: str
    repo_id: str | None = None  # Hugging Face repository, if it is on the Hub
    repo_path: str | None = None  # path inside that repository
    url: str | None = None  # otherwise a direct (or manual) source
    versions: tuple[str, ...] = VERSIONS
    alternatives: tuple[str, ...] = ()
    optional: bool = False  # the engine runs without it (BiSeNet: a landmark mask replaces it)

    @property
    def local_dir(self) -> str:
        """Folder that `hf_hub_download(local_dir=...)` must get so the file lands on `local`."""
        assert self.repo_path is not None and self.local.endswith(self.repo_path)
        return self.local[: len(self.local) - len(self.repo_path)].rstrip("/")

    def present(self, models_dir: Path) -> Path | None:
        for rel in (self.local, *self.alternatives):
            p = models_dir / rel
            if p.is_file():
                return p
        return None


MODEL_FILES: tuple[ModelFile, ...] = (
    ModelFile("musetalkV15/musetalk.json", "UNet config (v1.5)", "TMElyralab/MuseTalk", "musetalkV15/musetalk.json",
              versions=("v15",)),
    ModelFile("musetalkV15/unet.pth", "UNet weights (v1.5)", "TMElyralab/MuseTalk", "musetalkV15/unet.pth",
              versions=("v15",)),
    ModelFile("musetalk/musetalk.json", "UNet config (v1.0)", "TMElyralab/MuseTalk", "musetalk/musetalk.json",
              versions=("v10",)),
    ModelFile("musetalk/pytorch_model.bin", "UNet weights (v1.0)", "TMElyralab/MuseTalk", "musetalk/pytorch_model.bin",
              versions=("v10",)),
    ModelFile("sd-vae/config.json", "VAE config", "stabilityai/sd-vae-ft-mse", "config.json"),
    ModelFile("sd-vae/diffusion_pytorch_model.bin", "VAE weights", "stabilityai/sd-vae-ft-mse",
              "diffusion_pytorch_model.bin", alternatives=("sd-vae/diffusion_pytorch_model.safetensors",)),
    ModelFile("whisper/config.json", "Whisper-tiny config", "openai/whisper-tiny", "config.json"),
    ModelFile("whisper/pytorch_model.bin", "Whisper-tiny weights (encoder used)", "openai/whisper-tiny",
              "pytorch_model.bin", alternatives=("whisper/model.safetensors",)),
    ModelFile("whisper/preprocessor_config.json", "Whisper feature-extractor settings", "openai/whisper-tiny",
              "preprocessor_config.json"),
    ModelFile("face-parse-bisent/79999_iter.pth", "BiSeNet face parsing (official blend mask; optional)",
              url="https://drive.google.com/uc?id=154JgKpzCPW82qINcVieuPH3fZ2e0P812", optional=True),
    ModelFile("face-parse-bisent/resnet18-5c106cde.pth", "ResNet-18 opened by the BiSeNet constructor (optional)",
              url="https://download.pytorch.org/models/resnet18-5c106cde.pth", optional=True),
)


def model_files(version: str = "v15") -> list[ModelFile]:
    _check_version(version)
    return [f for f in MODEL_FILES if version in f.versions]


def missing_files(models_dir: str | Path, version: str = "v15", *, include_optional: bool = False) -> list[ModelFile]:
    """The files of `version` that are not in `models_dir` (empty list = the engine can run).
    Optional files (BiSeNet face parsing) count only with `include_optional`."""
    d = Path(models_dir)
    return [f for f in model_files(version) if f.present(d) is None and (include_optional or not f.optional)]


def _check_version(version: str) -> None:
    if version not in VERSIONS:
        raise ValueError(f"MuseTalk version must be one of {VERSIONS}, got {version!r}")


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------

class MuseTalkWeightsMissing(FileNotFoundError):
    """A file of the official layout is absent."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        super().__init__(f"MuseTalk {what} not found: {path} is missing. Get the official weights with "
                         f"`{FETCH_COMMAND}` (or download_weights.sh of TMElyralab/MuseTalk), "
                         f"or use --weights random for benchmarks.")


class MuseTalkWeightsError(ValueError):
    """A checkpoint exists but does not fit the network (keys, shapes, unreadable file)."""


# --------------------------------------------------------------------------------------------
# Reading state dicts
# --------------------------------------------------------------------------------------------

def _need(path: Path, what: str) -> Path:
    if not path.is_file():
        raise MuseTalkWeightsMissing(path, what)
    return path


def _first(paths: Iterable[Path], what: str) -> Path:
    paths = list(paths)
    for p in paths:
        if p.is_file():
            return p
    raise MuseTalkWeightsMissing(paths[0], what)


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A `.safetensors` file or a torch pickle (tensors only), on the CPU."""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path), device="cpu")
        else:
            sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise MuseTalkWeightsError(f"{path}: cannot read checkpoint ({type(exc).__name__}: {exc})") from exc
    if isinstance(sd, Mapping) and "state_dict" in sd and isinstance(sd["state_dict"], Mapping):
        sd = sd["state_dict"]
    if not isinstance(sd, Mapping) or not all(isinstance(k, str) for k in sd):
        raise MuseTalkWeightsError(f"{path}: expected a state_dict (name -> tensor), got {type(sd).__name__}")
    return dict(sd)


def state_dict_problems(module: nn.Module, sd: Mapping[str, torch.Tensor], limit: int = 8) -> list[str]:
    """Human-readable differences in keys and shapes (empty list = a strict load will succeed)."""
    ours = module.state_dict()
    missing = [k for k in ours if k not in sd]
    unexpected = [k for k in sd if k not in ours]
    shapes = [f"{k}: file {tuple(sd[k].shape)} vs network {tuple(ours[k].shape)}"
              for k in ours if k in sd and tuple(sd[k].shape) != tuple(ours[k].shape)]
    out = []
    for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)):
        if items:
            more = f" ... (+{len(items) - limit} more)" if len(items) > limit else ""
            out.append(f"{len(items)} {label}: {', '.join(items[:limit])}{more}")
    return out


def load_strict(module: nn.Module, sd: Mapping[str, torch.Tensor], source: str | Path) -> nn.Module:
    problems = state_dict_problems(module, sd)
    if problems:
        raise MuseTalkWeightsError(f"{source} does not fit {type(module).__name__} (strict load): " + "; ".join(problems))
    module.load_state_dict(sd, strict=True)
    return module


_LEGACY_ATTN = re.compile(r"^(.*\.attentions\.\d+\.)(query|key|value|proj_attn)\.(weight|bias)$")
_LEGACY_NAMES = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}


def convert_legacy_vae_keys(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """sd-vae-ft-mse's `diffusion_pytorch_model.bin` names the mid-block attention
    `query/key/value/proj_attn`; current diffusers calls them `to_q/to_k/to_v/to_out.0` (same
    tensors; a 1x1-conv shaped weight is flattened to the Linear shape)."""
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        m = _LEGACY_ATTN.match(k)
        if m:
            k = f"{m.group(1)}{_LEGACY_NAMES[m.group(2)]}.{m.group(3)}"
            if m.group(3) == "weight" and v.dim() == 4 and v.shape[2:] == (1, 1):
                v = v[:, :, 0, 0]
        out[k] = v
    return out


def whisper_encoder_state_dict(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The encoder part of a Whisper checkpoint, keyed like `WhisperEncoder.state_dict()`.

    Accepts the HF `WhisperForConditionalGeneration` file (`model.encoder.*`), a `WhisperModel`
    state dict (`encoder.*`) or an encoder-only one."""
    for prefix in ("model.encoder.", "encoder."):
        picked = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
        if picked:
            return picked
    return dict(sd)


# --------------------------------------------------------------------------------------------
# Builders and loaders
# --------------------------------------------------------------------------------------------

def _whisper_config(config: Mapping[str, Any] | Any | None):
    from transformers import WhisperConfig

    if config is None:
        config = WHISPER_TINY_CONFIG
    if isinstance(config, WhisperConfig):
        cfg = config
    else:
        cfg = WhisperConfig(**dict(config))
    cfg.dropout = 0.0
    cfg.attention_dropout = 0.0
    cfg.activation_dropout = 0.0
    return cfg


def build_whisper_encoder(config: Mapping[str, Any] | Any | None = None, device: torch.device | str = "cpu",
                          dtype: torch.dtype = torch.float32) -> nn.Module:
    """A transformers `WhisperEncoder` (whisper-tiny by default) with uninitialised storage on
    `device`, eval mode, sdpa attention. Fill it or load it next."""
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = _whisper_config(config)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        enc = WhisperEncoder(cfg)
    enc = enc.to_empty(device=device).to(dtype=dtype)
    return enc.eval().requires_grad_(False)


class _EncoderKeys(nn.Module):
    """Holds an encoder as `.encoder` so its state_dict keys read `encoder.*`, as in `WhisperModel`."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder


def fill_whisper_encoder_seeded_(encoder: nn.Module, salt: int = 0) -> nn.Module:
    """`fill_seeded_` under the `WhisperModel` key names (`encoder.conv1.weight`, ...): the encoder
    gets exactly the values it has when the whole `WhisperModel` is filled (values depend only on
    key, shape and salt), without building the decoder."""
    fill_seeded_(_EncoderKeys(encoder), salt)
    return encoder


def _check_fully_defined(module: nn.Module) -> None:
    """Meta construction is only safe when every buffer is in the state_dict and floating."""
    sd = module.state_dict()
    for name, _ in module.named_buffers():
        if name not in sd:
            raise RuntimeError(f"{type(module).__name__} has a non-persistent buffer {name}; meta build unsafe")
    for k, v in sd.items():
        if not v.is_floating_point():
            raise RuntimeError(f"{type(module).__name__}.{k} is not floating point; fill_seeded_ would leave it empty")


def random_unet(salt: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                config: Mapping[str, Any] | None = None) -> nn.Module:
    unet = build_unet(dict(config or UNET_CONFIG), device=device, dtype=dtype)
    _check_fully_defined(unet)
    return fill_seeded_(unet, salt)


def random_vae(salt: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
               config: Mapping[str, Any] | None = None) -> nn.Module:
    vae = build_vae(dict(config or VAE_CONFIG), device=device, dtype=dtype)
    _check_fully_defined(vae)
    return fill_seeded_(vae, salt)


def random_whisper_encoder(salt: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                           config: Mapping[str, Any] | Any | None = None) -> nn.Module:
    enc = build_whisper_encoder(config, device=device, dtype=dtype)
    _check_fully_defined(enc)
    return fill_whisper_encoder_seeded_(enc, salt)


@dataclass
class MuseTalkModels:
    """Everything the MuseTalk render path needs, on one device and dtype."""

    unet: nn.Module
    vae: nn.Module
    whisper_encoder: nn.Module
    pe: PositionalEncoding
    version: str
    device: torch.device
    dtype: torch.dtype
    random_salt: int | None = None  # None = official weights

    @property
    def is_random(self) -> bool:
        return self.random_salt is not None


def build_random(salt: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 version: str = "v15") -> MuseTalkModels:
    """The official architectures filled with seeded random weights (`--weights random`).

    The UNet has 850M parameters: filling it takes tens of seconds on a CPU; cache the result.
    """
    _check_version(version)
    device = torch.device(device)
    return MuseTalkModels(
        unet=random_unet(salt, device, dtype),
        vae=random_vae(salt, device, dtype),
        whisper_encoder=random_whisper_encoder(salt, device, dtype),
        pe=PositionalEncoding().to(device=device, dtype=dtype),
        version=version, device=device, dtype=dtype, random_salt=salt,
    )


def unet_paths(models_dir: str | Path, version: str = "v15") -> tuple[Path, Path]:
    """(config, weights) of the UNet of `version` in the official layout."""
    _check_version(version)
    d = Path(models_dir)
    if version == "v15":
        return d / "musetalkV15" / "musetalk.json", d / "musetalkV15" / "unet.pth"
    return d / "musetalk" / "musetalk.json", d / "musetalk" / "pytorch_model.bin"


def load_unet(models_dir: str | Path, version: str = "v15", device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> nn.Module:
    cfg_path, w_path = unet_paths(models_dir, version)
    cfg = load_unet_config(_need(cfg_path, f"UNet config ({version})"))
    sd = read_state_dict(_need(w_path, f"UNet weights ({version})"))
    unet = build_unet(cfg, device=device, dtype=dtype)
    return load_strict(unet, sd, w_path)


def load_vae(models_dir: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> nn.Module:
    d = Path(models_dir) / "sd-vae"
    cfg = load_vae_config(_need(d / "config.json", "VAE config"))
    w = _first([d / "diffusion_pytorch_model.bin", d / "diffusion_pytorch_model.safetensors"], "VAE weights")
    sd = convert_legacy_vae_keys(read_state_dict(w))
    vae = build_vae(cfg, device=device, dtype=dtype)
    return load_strict(vae, sd, w)


def load_whisper_encoder(models_dir: str | Path, device: torch.device | str = "cpu",
                         dtype: torch.dtype = torch.float32) -> nn.Module:
    """The encoder of the HF whisper-tiny folder `<models_dir>/whisper` (config read locally only)."""
    from transformers import WhisperConfig

    d = Path(models_dir) / "whisper"
    _need(d / "config.json", "Whisper config")
    cfg = WhisperConfig.from_pretrained(str(d), local_files_only=True)
    w = _first([d / "pytorch_model.bin", d / "model.safetensors"], "Whisper weights")
    sd = whisper_encoder_state_dict(read_state_dict(w))
    enc = build_whisper_encoder(cfg, device=device, dtype=dtype)
    return load_strict(enc, sd, w)


def load_official(models_dir: str | Path, version: str = "v15", device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32) -> MuseTalkModels:
    """UNet (`version`), VAE and Whisper encoder from the official layout, all strictly loaded."""
    _check_version(version)
    device = torch.device(device)
    return MuseTalkModels(
        unet=load_unet(models_dir, version, device, dtype),
        vae=load_vae(models_dir, device, dtype),
        whisper_encoder=load_whisper_encoder(models_dir, device, dtype),
        pe=PositionalEncoding().to(device=device, dtype=dtype),
        version=version, device=device, dtype=dtype,
    )


# --------------------------------------------------------------------------------------------
# Writing (tests, conversions) and fetching
# --------------------------------------------------------------------------------------------

def save_official_layout(models: MuseTalkModels, models_dir: str | Path, *, whisper_prefix: str = "model.encoder.",
                         unet_config: Mapping[str, Any] | None = None,
                         vae_config: Mapping[str, Any] | None = None) -> Path:
    """Write `models` in the official layout (UNet of `models.version`, VAE, Whisper encoder
    stored under `model.encoder.*` like the HF file). Used to round-trip random weights."""
    d = Path(models_dir)
    cfg_path, w_path = unet_paths(d, models.version)
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    ucfg = dict(unet_config or {k: v for k, v in models.unet.config.items() if not k.startswith("_")})
    cfg_path.write_text(json.dumps({"_class_name": "UNet2DConditionModel", **ucfg}, indent=1))
    torch.save({k: v.detach().cpu() for k, v in models.unet.state_dict().items()}, w_path)
    vdir = d / "sd-vae"
    vdir.mkdir(parents=True, exist_ok=True)
    vcfg = dict(vae_config or {k: v for k, v in models.vae.config.items() if not k.startswith("_")})
    (vdir / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKL", **vcfg}, indent=1))
    torch.save({k: v.detach().cpu() for k, v in models.vae.state_dict().items()}, vdir / "diffusion_pytorch_model.bin")
    wdir = d / "whisper"
    wdir.mkdir(parents=True, exist_ok=True)
    models.whisper_encoder.config.to_json_file(str(wdir / "config.json"))
    torch.save({whisper_prefix + k: v.detach().cpu() for k, v in models.whisper_encoder.state_dict().items()},
               wdir / "pytorch_model.bin")
    return d


def fetch(models_dir: str | Path, version: str = "v15", *, include_optional: bool = True) -> list[Path]:
    """Download the missing files of `version` into `models_dir` (Hugging Face Hub; the optional
    ResNet-18 from download.pytorch.org) and return their paths. Raises `MuseTalkWeightsError` with
    a clear message when a download fails (offline, ...). BiSeNet's 79999_iter.pth is only on
    Google Drive: a missing one is reported with a warning saying where to get it."""
    d = Path(models_dir)
    got: list[Path] = []
    manual: list[str] = []
    for f in missing_files(d, version, include_optional=include_optional):
        try:
            if f.repo_id is not None:
                from huggingface_hub import hf_hub_download

                p = Path(hf_hub_download(f.repo_id, f.repo_path, local_dir=str(d / f.local_dir)))
            elif f.url is not None and "drive.google.com" not in f.url:
                p = d / f.local
                p.parent.mkdir(parents=True, exist_ok=True)
                torch.hub.download_url_to_file(f.url, str(p), progress=False)
            else:
                manual.append(f"{f.local} ({f.purpose}): download {f.url} to {d / f.local}")
                continue
        except Exception as exc:  # no network, no such file, permission ...
            src = f"{f.repo_id}/{f.repo_path}" if f.repo_id else f.url
            raise MuseTalkWeightsError(
                f"could not download {src} to {d / f.local} ({type(exc).__name__}: {exc}). "
                "Check the network connection (or HF_ENDPOINT / a proxy), or copy the official "
                f"`models/` folder there by hand.") from exc
        got.append(p)
    if manual:
        warnings.warn("optional files not on the Hugging Face Hub, fetch them by hand: " + "; ".join(manual),
                      stacklevel=2)
    return got
