"""What a user of Ditto's official PyTorch release gets: the reference-style pipeline, re-created.

``inference.py`` of antgroup/ditto-talkinghead with ``ditto_pytorch`` + ``v0.4_hubert_cfg_pytorch.pkl``
drives ``stream_pipeline_offline.StreamSDK``:

* HuBERT features for the WHOLE audio first (``Wav2FeatHubert.wav2feat``: one 6480-sample
  window per call, batch 1, results as numpy);
* one thread per stage, numpy arrays on queues between them (QUEUE_MAX_SIZE 100):
  ``audio2motion`` (condition handler in numpy, then every 80-frame LMDM window - DDIM with
  classifier-free guidance as TWO decoder passes per step, ``guided_forward`` - results copied to
  the CPU, fused and smoothed, then one x_d_info dict per frame), ``motion_stitch`` (per frame),
  ``warp_f3d`` and ``decode_f3d`` (per frame, batch 1, float32 modules under
  ``torch.autocast(float16)`` with the spectral norm computed on every call, each result copied
  back with ``.float().cpu().numpy()``), ``putback`` (per frame on the CPU: two
  ``cv2.warpAffine`` into the full frame + blend), ``writer``;
* the avatar's ``source_info`` (frames as RGB arrays, f_s per frame as float32 numpy, x_s_info,
  M_c2o, eye state) lives in memory; the release re-registers the source on every run, a user who
  caches it pickles that dict (``save_source`` / ``load_source``: the reference avatar cold start).

Differences, on purpose: the source_info is built from our packet's Ditto arrays (same faces,
crops and features for both pipelines); the writer only counts frames (no imageio/ffmpeg
encode, which favours the reference); random numbers come from seeded generators.
"""
from __future__ import annotations

import pickle
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from newsstudio.engines.base import pingpong_index
from newsstudio.engines.ditto.config import DittoConfig
from newsstudio.engines.ditto.ddim import DDIMSampler
from newsstudio.engines.ditto.lmdm import generate_motion
from newsstudio.engines.ditto.models import SPADEDecoder, WarpingNetwork
from newsstudio.engines.ditto.motion_stitch import MotionStitchConfig, MotionStitcher, motion_rows_to_info, source_kp_cond
from newsstudio.engines.ditto.putback import PutBack
from newsstudio.engines.ditto.registration import INFO_KEYS
from newsstudio.engines.ditto.wav2feat import wav2feat_offline
from newsstudio.engines.ditto.weights import narrowed_image_nets
from newsstudio.weights.seeded import fill_seeded_

QUEUE_MAX_SIZE = 100


class TwoPassCFG(nn.Module):
    """The official guided prediction: the MotionDecoder run twice per DDIM step (condition kept,
    condition dropped), ``x0 = uncond + (cond - uncond) * w``. Same interface as ``models.lmdm.LMDM``
    for ``DDIMSampler``."""

    def __init__(self, lmdm: nn.Module) -> None:
        super().__init__()
        self.inner = lmdm
        self.seq_frames = lmdm.seq_frames
        self.motion_feat_dim = lmdm.motion_feat_dim
        self.guidance_weight = lmdm.guidance_weight

    @property
    def alphas_cumprod(self) -> torch.Tensor:
        return self.inner.alphas_cumprod

    def encode_condition(self, cond):
        return None  # the official code encodes the condition inside every pass

    def forward(self, x, cond_frame, cond, time_cond, encoded=None):
        m = self.inner
        out_c = m.model(x, cond_frame, cond, time_cond, cond_drop_prob=0.0)
        out_u = m.model(x, cond_frame, cond, time_cond, cond_drop_prob=1.0)
        x_start = out_u + (out_c - out_u) * self.guidance_weight
        a = m._extract(m.sqrt_recip1m_alphas_cumprod, time_cond, x)
        b = m._extract(m.sqrt_recipm1_alphas_cumprod, time_cond, x)
        return a * x - x_start / b, x_start


def reference_image_nets(salt: int, device: torch.device, width_divisor: int = 1) -> tuple[nn.Module, nn.Module]:
    """Warp + decoder as the release runs them: float32 modules (autocast at call time), spectral
    norm NOT folded (computed from weight_orig, u, v on every forward). Same seeded values as ours
    (``width_divisor``: the engine config's, for the developer architecture)."""
    arch = narrowed_image_nets(width_divisor)
    warp = fill_seeded_(WarpingNetwork(**arch["warp"]), salt).to(device).eval().requires_grad_(False)
    dec = fill_seeded_(SPADEDecoder(**arch["decoder"]), salt).to(device).eval().requires_grad_(False)
    return warp, dec


# ------------------------------------------------------------------------------------ source_info


def build_source(packet) -> dict[str, Any]:
    """The release's in-memory ``source_info`` for the packet's frames (numpy, float32 f_s)."""
    from newsstudio.compose.colour import nv12_to_rgb

    n = packet.n_frames
    f_s = packet.array("ditto/f_s")
    frames = packet.tensor("frames_nv12")
    rgb = [nv12_to_rgb(frames[i : i + 1])[0].numpy() for i in range(n)]
    info = {k: np.asarray(packet.array(f"ditto/x_s_info_{k}"), np.float32) for k in INFO_KEYS}
    return {
        "x_s_info_lst": [{k: info[k][i : i + 1].copy() for k in INFO_KEYS} for i in range(n)],
        "f_s_lst": [np.asarray(f_s[i : i + 1], np.float32) for i in range(n)],
        "M_c2o_lst": [np.asarray(m, np.float32) for m in packet.array("ditto/m_c2o")],
        "eye_open_lst": [e[None].copy() for e in np.asarray(packet.array("ditto/eye_open"))],
        "eye_ball_lst": [e[None].copy() for e in np.asarray(packet.array("ditto/eye_ball"))],
        "sc": np.asarray(packet.array("ditto/sc"), np.float32).reshape(-1),
        "is_image_flag": n == 1,
        "img_rgb_lst": rgb,
    }


def save_source(source: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(source, f, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def load_source(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return pickle.load(f)


def conditions_numpy(source: dict[str, Any], aud_feat: np.ndarray, cfg: DittoConfig) -> np.ndarray:
    """``ConditionHandler(aud_feat, 0)`` in numpy: [audio | emotion | eye open | eye ball | sc]."""
    n = len(aud_feat)
    parts = [aud_feat]
    if cfg.use_emo:
        emo = cfg.emotion_rows()
        parts.append(np.repeat(emo, n, 0) if len(emo) == 1 else emo[np.arange(n) % len(emo)])
    idx = np.asarray(pingpong_index(np.arange(n), len(source["eye_open_lst"])))
    for key, use in (("eye_open_lst", cfg.use_eye_open), ("eye_ball_lst", cfg.use_eye_ball)):
        if use:
            arr = np.concatenate(source[key], 0)
            parts.append(np.repeat(arr[:1], n, 0) if (len(arr) == 1 or cfg.eye_f0_mode) else arr[idx])
    if cfg.use_sc:
        parts.append(np.repeat(source["sc"][None], n, 0))
    return np.concatenate(parts, -1).astype(np.float32)


# ------------------------------------------------------------------------------------ pipeline


@dataclass
class ReferenceRun:
    frames: int
    seconds: float
    first_frame_s: float
    features_s: float
    stage_busy_s: dict[str, float] = field(default_factory=dict)

    @property
    def fps(self) -> float:
        return self.frames / self.seconds

    def to_json(self) -> dict[str, Any]:
        return {"frames": self.frames, "seconds": self.seconds, "first_frame_s": self.first_frame_s,
                "features_s": self.features_s, "stage_busy_s": dict(self.stage_busy_s)}


@torch.no_grad()
def run_reference(models, cfg: DittoConfig, source: dict[str, Any], audio_16k: np.ndarray, *, warp: nn.Module,
                  decoder: nn.Module, steps: int = 4, seed: int = 0, keep_frames: bool = False) -> ReferenceRun:
    """One offline run, audio already available (see the module doc). ``models``: the engine's
    ``DittoModels`` (HuBERT, LMDM, stitching MLP); ``warp``/``decoder``: ``reference_image_nets``."""
    dev = models.device
    busy: dict[str, float] = defaultdict(float)
    errors: list[BaseException] = []
    stop = threading.Event()
    qs = {k: queue.Queue(maxsize=QUEUE_MAX_SIZE) for k in ("a2m", "stitch", "warp", "decode", "putback", "writer")}
    n_src = len(source["f_s_lst"])
    autocast = dev.type == "cuda"
    out: dict[str, Any] = {"frames": 0, "first": None, "kept": []}

    def put(name: str, item: Any) -> None:
        while not stop.is_set():
            try:
                qs[name].put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def worker(name: str, nxt: str | None, fn):
        def run() -> None:
            try:
                while not stop.is_set():
                    try:
                        item = qs[name].get(timeout=0.5)
                    except queue.Empty:
                        continue
                    if item is None:
                        if nxt:
                            put(nxt, None)
                        return
                    t = time.perf_counter()
                    res = fn(item)
                    busy[name] += time.perf_counter() - t
                    if nxt is not None:
                        for r in (res if name == "a2m" else [res]):
                            put(nxt, r)
            except BaseException as e:  # surfaced after join
                errors.append(e)
                stop.set()
        return threading.Thread(target=run, daemon=True, name=f"ref-{name}")

    gen = torch.Generator(device=dev).manual_seed(seed)
    sampler = DDIMSampler(TwoPassCFG(models.lmdm), steps=steps, eta=1.0, generator=gen)
    first_info = {k: torch.from_numpy(v).to(dev) for k, v in source["x_s_info_lst"][0].items()}
    kp_cond = source_kp_cond(first_info)
    stitcher = MotionStitcher(models.stitch)
    stitcher.setup(MotionStitchConfig(use_d_keys=cfg.use_d_keys, relative_d=cfg.relative_d, drive_eye=cfg.drive_eye,
                                      flag_stitching=cfg.flag_stitching, is_image_flag=source["is_image_flag"],
                                      fade_type=cfg.fade_type, overall_ctrl_info=dict(cfg.overall_ctrl_info)),
                   x_s_info=first_info)
    putback = PutBack(crop_size=int(source["f_s_lst"][0].shape[-1]) * 8, backend="cv2")

    def a2m(aud_feat: np.ndarray) -> list:
        cond = torch.from_numpy(conditions_numpy(source, aud_feat, cfg)).to(dev)
        res = generate_motion(sampler, kp_cond, cond, overlap=cfg.overlap_v2, smooth_k=cfg.smo_k_d).cpu().numpy()
        items = []
        for i, row in enumerate(res):  # cvt_fmt: one dict of (1, dim) arrays per frame
            items.append((int(pingpong_index(i, n_src)), row))
        return items

    def stitch(item):
        fi, row = item
        x_s_info = {k: torch.from_numpy(v).to(dev) for k, v in source["x_s_info_lst"][fi].items()}
        x_d_info = motion_rows_to_info(torch.from_numpy(row[None]).to(dev))
        r = stitcher(x_s_info, x_d_info)
        return fi, r.x_s.cpu().numpy(), r.x_d.cpu().numpy()

    def warp_f3d(item):
        fi, x_s, x_d = item
        with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=autocast):
            f = warp(torch.from_numpy(source["f_s_lst"][fi]).to(dev), torch.from_numpy(x_s).to(dev), torch.from_numpy(x_d).to(dev))
        return fi, f.float().cpu().numpy()

    def decode_f3d(item):
        fi, f3d = item
        with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=autocast):
            img = decoder(torch.from_numpy(f3d).to(dev))
        img = img.float().cpu().numpy()
        return fi, np.transpose(img[0], (1, 2, 0)).clip(0, 1) * 255

    def paste(item):
        fi, render = item
        return putback(source["img_rgb_lst"][fi], render, source["M_c2o_lst"][fi])

    def writer(frame):
        if out["first"] is None:
            out["first"] = time.perf_counter()
        out["frames"] += 1
        if keep_frames:
            out["kept"].append(frame)

    threads = [worker("a2m", "stitch", a2m), worker("stitch", "warp", stitch), worker("warp", "decode", warp_f3d),
               worker("decode", "putback", decode_f3d), worker("putback", "writer", paste), worker("writer", None, writer)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    feats = wav2feat_offline(torch.from_numpy(np.ascontiguousarray(audio_16k, np.float32)), models.hubert, cfg.chunksize,
                             batch_size=1).cpu().numpy()
    features_s = time.perf_counter() - t0
    put("a2m", feats)
    put("a2m", None)
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    t_end = time.perf_counter()
    run = ReferenceRun(out["frames"], t_end - t0, (out["first"] or t_end) - t0, features_s, dict(busy))
    if keep_frames:
        run.kept = out["kept"]  # type: ignore[attr-defined]
    return run
