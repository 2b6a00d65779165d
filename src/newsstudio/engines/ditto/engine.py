"""The Ditto engine: HuBERT features -> LMDM motion windows -> motion stitch -> warp + SPADE decode.

Stages (engines/base.py), all on the engine's device:

1. ``conditioner(fps)`` (always 25 fps rows, Ditto's training rate): the reference's online HuBERT
   windowing (``wav2feat.StreamingWav2Feat``: 6480-sample windows every 5 frames, 3 frames of
   left context and 2 of look-ahead) -> one 1024-d row per 25 fps frame. The stream is cut to
   ceil(samples / 640) rows at ``close``.
2. ``driver(layer)`` (:class:`DittoDriver`): per frame the 1103-d condition
   [audio 1024 | emotion 8 | eye open 2 | eye ball 6 | source kp 63] (``ConditionHandler``),
   then ``lmdm.MotionWindowStream`` (80-frame windows, DDIM with batched classifier-free
   guidance, cross-fade over ``overlap_v2`` frames, moving-average smoothing) which hands out
   motion rows as soon as no later window can change them. Driving = ``(B, 531)`` rows
   [motion 265 | the stream's relative-driving reference d0 265 | blink index]. At an output
   rate other than 25 fps (``driver(layer, fps)``) the rows are resampled to it (resample.py).
3. ``render``: motion stitching (``MotionStitcher``: relative driving on the source keypoints of
   the frame actually shown, lip/eye rows, stitching MLP; done here and not in the driver because
   a live session may start an utterance anywhere on a video loop), then
   ``WarpingNetwork(f_s[frame], x_s, x_d)`` -> ``SPADEDecoder`` -> (B, 3, 512, 512)
   -> ``compose.splice.sample_crops_to_roi`` with the packet's per-frame grids: the crop lands in
   the avatar's Ditto ROI exactly like the reference's ``cv2.warpAffine(render, M_c2o)``, with
   the reference's feathered ``get_mask`` as alpha. Float16 (with autocast) on CUDA like the
   reference wrappers; LMDM and the stitching MLP in float32.

Online mode, and one deliberate difference: the reference's online pipeline puts ``overlap_v2``
rows of silence features in front of the audio (a warm-up so the first window needs only
``80 - overlap_v2`` audio frames) and takes the relative-driving reference ``d0`` from the first
generated row; we do the same. It then emits rows starting ``80 - fuse`` rows into the first
window, which for ``overlap_v2`` < 40 (the setup default is 10) shows audio frame
``80 - 2*overlap_v2`` on output frame 0 (a 2.4 s lag at the default); we emit motion row
``overlap_v2 + k`` on output frame k, i.e. frame k shows audio frame k.

Idle: ``idle_driving`` returns rest rows (blink index -1), which ``render`` turns into each
frame's own source keypoints (x_d = x_s): the avatar at rest, the source frame itself through
the networks.

Latency: the first window needs ``80 - overlap_v2`` frames of audio (70 at the default, 2.8 s of
speech, plus 80 ms HuBERT look-ahead) before any motion exists; a larger ``overlap_v2`` lowers
that at the cost of more LMDM windows per second of speech.

Options: any :class:`config.DittoConfig` field as a keyword (``steps=2``, ``overlap_v2=...``,
``emo=3``...), on top of the official config pickle when the models folder has one. For tests and
quick benchmarks, ``NEWSSTUDIO_DITTO_OPTIONS`` may hold a JSON object of such options (explicit
keywords win): e.g. ``{"input_size": 128, "hubert_layers": 2, "width_divisor": 4}``
(``config.TINY_OPTIONS``) shrinks the networks' input, the random HuBERT and the image networks'
widths - developer use only, never for real output.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...accel.group_norm_nhwc import with_nhwc_group_norms
from ...accel.host_copy import to_device
from ...accel.igemm_conv import CALIBRATED_MODES, ENGINE_FP8_HEADROOM, calibrate_fp8_, with_triton_convs
from ...accel.precision import to_channels_last_
from ...accel.settings import resolve_accel
from ...accel.static import BucketedRunner, render_buckets
from ...avatar.packet import Packet, PacketError
from ...compose.splice import sample_crops_to_roi
from ..base import AvatarLayer, Engine, FrameQueue, neural_defaults, same_layer_runs, warn_random_weights
from ..batching import TensorBatcher
from ..model_cache import ModelCache
from .config import DittoConfig, load_config
from .frame_queues import DRIVING_DIM, MOTION_DIM, REST_FLAG, DittoConditioner, DittoDriver
from .lmdm import MotionBatcher
from .models.regrouped import RegroupedSPADEDecoder, regrouped_warp, use_nhwc_spade_norms_
from .motion_stitch import (
    NUM_KP, MotionStitchConfig, MotionStitcher, bin66_to_degree, motion_rows_to_info, source_kp_cond, transform_info,
)
from .registration import INFO_KEYS, expected_meta, prebake_ditto, prebake_mismatch
from .resample import MotionResampler, check_fps
from .stride import StrideRenderer, check_stride
from .wav2feat import SAMPLES_PER_FRAME, split_len, wav2feat_offline
from .weights import DittoModels, build_random, load_official

SAMPLE_RATE = 16000
FPS = 25
OPTIONS_ENV = "NEWSSTUDIO_DITTO_OPTIONS"

_MODELS: ModelCache[DittoModels] = ModelCache(2)


def get_models(weights: str, models_dir: Path, salt: int, device: torch.device, dtype: torch.dtype,
               cfg: DittoConfig, hubert: str | Path | None = None, channels_last: bool = False) -> DittoModels:
    """Build or load the networks once per process (engines with equal settings share them).
    ``channels_last``: warp and decoder weights in NHWC / NDHWC (a separate copy: see model_cache)."""

    def build() -> DittoModels:
        if weights == "random":
            m = build_random(salt, device, dtype, cfg)
        else:
            m = load_official(models_dir, device, dtype, cfg, hubert=hubert)
        if channels_last:
            to_channels_last_(m.warp)
            to_channels_last_(m.decoder)
        return m

    key = (weights, str(models_dir.resolve()), salt, str(device), str(dtype), cfg.motion_feat_dim, cfg.audio_feat_dim,
           cfg.seq_frames, cfg.hubert_layers if weights == "random" else None, cfg.width_divisor, str(hubert), channels_last)
    return _MODELS.get(key, build)


#: Config options that shrink the architecture (tests only) -> their value with real weights.
TEST_ARCHITECTURE_OPTIONS: dict[str, Any] = {"hubert_layers": None, "width_divisor": 1}


def env_options() -> dict[str, Any]:
    raw = os.environ.get(OPTIONS_ENV, "").strip()
    if not raw:
        return {}
    try:
        opts = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{OPTIONS_ENV} must be a JSON object of Ditto options ({e})") from None
    if not isinstance(opts, dict):
        raise ValueError(f"{OPTIONS_ENV} must be a JSON object of Ditto options, got {type(opts).__name__}")
    return opts


# ---------------------------------------------------------------------------------------- engine

HUBERT_BATCH = 8  # audio windows per HuBERT call of one stream (5 frames each)
HUBERT_BUCKET_MAX = 32  # windows per call when a server's streams share it


def _column_spans(widths: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Each key's (start, end) columns when arrays of these widths sit side by side, in this order."""
    spans, a = {}, 0
    for k, w in widths.items():
        spans[k] = (a, a + w)
        a += w
    return spans


def stride_rows_on_host() -> bool:
    """Whether stride-mode engines made now take their rows on the host (`Engine.rows_on_host`): yes, unless
    ``NEWSSTUDIO_STRIDE_ROWS=device`` (the rows stay on the device and each render reads them back: one
    sync; the benchmarks' A/B, e.g. a load test's in-process server)."""
    return os.environ.get("NEWSSTUDIO_STRIDE_ROWS", "host") != "device"


class DittoEngine(Engine):
    """Ditto (PyTorch release) on one device.

    weights: ``"official"`` (the release layout under ``models``) or ``"random"`` (seeded with
    ``salt``; outputs are marked). ``hubert``: optional transformers HuBERT folder to use instead
    of the release's ONNX encoder. ``reprebake``: recompute a packet's Ditto arrays made with other
    weights/settings (True) or raise (False). ``accel``: how warp + decoder run on CUDA,
    ``"cudagraph"`` (default: CUDA graphs per batch bucket), ``"compile+cudagraph"`` (also
    ``torch.compile``d; ``compile=True`` asks for this), ``"compile"`` or ``"eager"``; CPU is eager.
    ``channels_last``: NHWC / NDHWC layout for the convolutions (default: with a compile mode only;
    under plain CUDA graphs it measured 14 % slower on an H200). ``cudnn_benchmark``: cuDNN
    autotuning (accel/cudnn.py; default on with CUDA).
    ``conv_rewrites``: warp and decoder regrouped for the GPU (models/regrouped.py: aligned 2-D forms
    of the badly shaped 3-D convs, phase convolutions instead of upsample + conv, stacked same-input
    convs; equal up to rounding; the shared plain networks stay as loaded). ``decoder_folds``: with
    them, the decoder's learned shortcuts take SPADE's beta through their 1x1 convs and its 4x phase
    upsampling computes the alike middle phases once (60 GFLOP a frame fewer, also exact; off:
    the regrouping before them, for benchmarks).
    ``nhwc_norms``: the decoder's SPADE norms by accel/group_norm_nhwc.py's kernels (channels-last
    activations; with ``conv_rewrites`` the statistics, then norm + modulation + LeakyReLU in one
    pass; else the statistics only; equal up to rounding; off: 4-6 % slower than Inductor's fused instance norm on
    an H100, benchmarks/RESULTS.md twenty-fifth session).
    ``triton_convs``: warp's and decoder's 2-D convolutions by the Triton implicit-GEMM kernel
    (accel/igemm_conv.py) in half precision (``"half"``), in FP8 (Hopper+) with each input's scale
    from its amax on every call (``"fp8"``) or fixed once when the engine is built (``"fp8-static"``:
    from the built-in portrait driven by seeded small motions, with 2x headroom), or by cuDNN
    (``"off"``, the default: with every eligible conv on the kernel in half, dense 1080x1920 ran at
    264.5 instead of 307.2 frames/s on an H100, benchmarks/RESULTS.md thirty-eighth session); CUDA only.
    ``stride``: warp + decode every ``stride``-th frame only and interpolate the frames between
    (``stride_mode``: how; see stride.py); 1 = dense.
    ``front_end_tf32``: HuBERT's and the LMDM's CUDA graphs captured with TF32 matmuls (their
    float32 GEMMs; levers on an H200: graphed LMDM 17.6 -> 8.6 ms, HuBERT 9.9 -> 3.9 ms for 8 windows
    at ~9e-4 relative error, tenth session; end to end dense 280 -> 304 fps, time to first frame
    55 -> 38 ms, eleventh; benchmarks/RESULTS.md). On by default; no effect without CUDA graphs
    (the CPU and eager paths stay float32).
    Further keywords: :class:`config.DittoConfig` fields (see the module doc).
    """

    name = "ditto"
    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        *,
        weights: str = "official",
        models: str | Path | None = None,
        salt: int = 0,
        hubert: str | Path | None = None,
        reprebake: bool = True,
        compile: bool = False,
        accel: str | None = None,
        channels_last: bool | None = None,
        cudnn_benchmark: bool | None = None,
        prebake_batch: int | None = None,
        conv_rewrites: bool = True,
        decoder_folds: bool = True,
        nhwc_norms: bool = False,
        triton_convs: str = "off",
        stride: int = 1,
        stride_mode: str = "mask",
        front_end_tf32: bool = True,
        **options: Any,
    ):
        device, dtype = neural_defaults(device, dtype, weights)
        super().__init__(device, dtype)
        from ..registry import models_dir as _models_dir

        self.models_dir = _models_dir(models)
        self.weights = weights
        self.random_weights = weights == "random"
        self.salt = int(salt) if self.random_weights else None
        opts = {**env_options(), **options}
        for test_only, real in TEST_ARCHITECTURE_OPTIONS.items():
            if not self.random_weights and opts.get(test_only, real) != real:
                raise ValueError(f"{test_only} (a test architecture) needs weights='random'")
        self.config = load_config(self.models_dir, **opts)
        if self.random_weights:
            warn_random_weights("Ditto", self.salt)
        acc = resolve_accel(device, accel, compile, channels_last, cudnn_benchmark, dtype)
        self.accel, self.channels_last, self.cudnn_benchmark = acc.mode, acc.channels_last, acc.cudnn_benchmark
        self.front_end_accel = acc.front_end_mode  # HuBERT and the LMDM sampler (CUDA graphs on CUDA)
        self.front_end_tf32 = bool(front_end_tf32)
        self.models = get_models(weights, self.models_dir, self.salt or 0, device, dtype, self.config, hubert,
                                 self.channels_last)
        self.weights_id = self.models.weights_id()
        self.reprebake = reprebake
        self.prebake_batch = prebake_batch or (16 if device.type == "cuda" else 2)
        self.conv_rewrites = bool(conv_rewrites)
        self._warp = regrouped_warp(self.models.warp) if self.conv_rewrites else self.models.warp
        self.decoder_folds = bool(decoder_folds) and self.conv_rewrites
        self._decoder = (RegroupedSPADEDecoder(self.models.decoder, folds=self.decoder_folds) if self.conv_rewrites
                         else self.models.decoder)
        if self.conv_rewrites and self.channels_last:
            to_channels_last_(self._warp)
            to_channels_last_(self._decoder)
        self.nhwc_norms = bool(nhwc_norms)
        if self.nhwc_norms and self.conv_rewrites:  # norm + modulation + LeakyReLU in one kernel
            use_nhwc_spade_norms_(self._decoder)
        elif self.nhwc_norms:  # the plain decoder: the InstanceNorms' statistics on the kernel
            self._decoder = with_nhwc_group_norms(self._decoder)[0]
        self.triton_convs, self._warp = with_triton_convs(self._warp, triton_convs, device, copied=self.conv_rewrites)
        _, self._decoder = with_triton_convs(self._decoder, self.triton_convs, device,
                                             copied=self.conv_rewrites or self.nhwc_norms)
        # warp + decoder as one static-shape callable per batch bucket (CUDA graphs: ~1,000 launches less per call)
        self._crop_runner = BucketedRunner(self._crops, self.accel, sizes=render_buckets())
        # HuBERT over fixed 6480-sample windows, 1-8 per call: ~700 small kernels each, graphed on CUDA.
        # (The release's ONNX encoder is not a torch module and runs as it is.)
        hub = self.models.hubert
        self._hubert_runner = (BucketedRunner(hub, self.front_end_accel, min_bucket=1, max_bucket=HUBERT_BUCKET_MAX,
                                              tf32=self.front_end_tf32)
                               if isinstance(hub, torch.nn.Module) else None)
        self.audio_batcher: TensorBatcher | None = None  # the server's streams share HuBERT calls
        # stride mode (stride.py): its driver rows carry the keyframes' rows; its renderer caches per stream
        self.stride = check_stride(stride, stride_mode)
        self.stride_mode = stride_mode
        self._strider = StrideRenderer(self, self.stride, stride_mode, DRIVING_DIM) if self.stride > 1 else None
        self.rows_on_host = self._strider is not None and stride_rows_on_host()  # its renderer plans on the CPU (base.Engine)
        self._silence: dict[int, torch.Tensor] = {}
        self._layers: dict[str, AvatarLayer] = {}
        #: shared by the streams of a server (`use_motion_batcher`): their LMDM windows sample in one batch
        self.motion_batcher: MotionBatcher | None = None
        self._lock = threading.RLock()
        if self.triton_convs in CALIBRATED_MODES:
            nets = torch.nn.ModuleList([self._warp, self._decoder])
            calibrate_fp8_(nets, lambda: self._crops(*self.calibration_batch()), ENGINE_FP8_HEADROOM)

    @property
    def file_block_s(self) -> float:
        """Audio block the runner pushes at a time for finite inputs: the first LMDM window's audio
        (80 - overlap_v2 frames, plus the HuBERT look-ahead and a margin: 3.2 s at the default), so
        the first window's HuBERT runs in one push instead of six. Measured on an H200 (time to first
        frame, 6.6 s of speech): 77 ms with 0.5 s blocks, 52 ms with 3.2 s, 82 ms with the whole file."""
        return (int(self.config.seq_frames) - int(self.config.overlap_v2) + 10) / 25.0

    # -- prebake ----------------------------------------------------------------------------------
    def expected_meta(self) -> dict[str, Any]:
        return expected_meta(self.config, self.weights_id)

    def prebake(self, packet: Packet, progress: bool = True, force: bool = False) -> Packet:
        """Add the ``ditto/...`` arrays (no-op when present for these weights and settings)."""
        if not force and prebake_mismatch(packet, self.expected_meta()) is None:
            return packet
        try:
            return prebake_ditto(packet, self.models, self.config, weights_id=self.weights_id,
                                 batch_size=self.prebake_batch, progress=progress)
        except PermissionError as e:
            raise PacketError(f"avatar packet {packet.path} is not writable, so Ditto's arrays cannot be added ({e}); "
                              "prebake it where it can be written (`newsstudio prebake ... --engines ditto`)") from e

    # -- avatar -----------------------------------------------------------------------------------
    def load_avatar(self, packet: Packet) -> AvatarLayer:
        with self._lock:
            expected = self.expected_meta()
            packet = self.usable_packet(packet, lambda p: prebake_mismatch(p, expected), self.reprebake)
            key = str(Path(packet.path).resolve())
            sha = packet.specs["ditto/f_s"].sha256 + packet.specs["ditto/grid"].sha256
            cached = self._layers.get(key)
            if cached is not None and cached.data.get("sha") == sha:
                return cached
            layer = self._make_layer(packet)
            layer.data["sha"] = sha
            self._layers = {key: layer}
            return layer

    def _make_layer(self, packet: Packet) -> AvatarLayer:
        dev = self.device
        n = packet.n_frames
        wr, hr = (int(v) for v in packet.engine_meta("ditto")["roi"])
        resident = dev.type != "cpu"  # on the CPU the memory maps are gathered from directly

        def put(name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
            t = packet.tensor(name)
            if resident:
                t = t.to(dev)
            return t if dtype is None else t.to(dtype)

        f_s = put("ditto/f_s")
        grid = put("ditto/grid")
        origins = put("ditto/origins", torch.long).to(dev)
        masks = packet.tensor("ditto/mask").to(dev).to(torch.float16 if dev.type == "cuda" else torch.float32).div_(255.0)
        x_s_info = {k: packet.tensor(f"ditto/x_s_info_{k}").to(dev, torch.float32) for k in INFO_KEYS}
        if (f_s.shape != (n, *self.models.feature_volume(self.config.input_size)) or grid.shape != (n, hr, wr, 2)
                or masks.shape != (n, hr, wr) or origins.shape != (n, 2)):
            raise PacketError(f"avatar {packet.id!r}: Ditto arrays have inconsistent shapes")
        data = {
            "f_s": f_s,
            "grid": grid,
            "x_s_info": x_s_info,
            # the same rows side by side, so a batch gathers its source frames' motion in one index_select
            "x_s_info_rows": torch.cat([x_s_info[k].reshape(n, -1) for k in INFO_KEYS], 1),
            "x_s_info_spans": _column_spans({k: x_s_info[k].reshape(n, -1).shape[1] for k in INFO_KEYS}),
            "x_s": transform_info(x_s_info).to(torch.float32),  # (N, 21, 3) source keypoints per frame
            "kp_cond": source_kp_cond(x_s_info).to(dev, torch.float32),
            "sc": packet.tensor("ditto/sc").to(dev, torch.float32).reshape(1, 63),
            "eye_open": packet.tensor("ditto/eye_open").to(dev, torch.float32),
            "eye_ball": packet.tensor("ditto/eye_ball").to(dev, torch.float32),
            "emo": torch.from_numpy(self.config.emotion_rows()).to(dev, torch.float32),
        }
        data["rest_row"] = torch.cat([data["kp_cond"], data["kp_cond"], torch.zeros(1, 1, device=dev)], 1)
        data["stitcher"] = self._stitcher(x_s_info, n)
        data["stitch_lock"] = threading.Lock()
        return AvatarLayer(self.name, packet, dev, (hr, wr), origins, masks, data)

    def _stitcher(self, x_s_info: dict[str, torch.Tensor], n_frames: int) -> MotionStitcher:
        """The avatar's MotionStitcher (settings from the config). It is used statelessly: the
        per-stream reference d0 and blink indices come with every driving row."""
        cfg = self.config
        st = MotionStitcher(self.models.stitch)
        first = {k: v[:1] for k, v in x_s_info.items()}
        st.setup(MotionStitchConfig(
            N_d=-1, use_d_keys=cfg.use_d_keys, relative_d=cfg.relative_d, drive_eye=cfg.drive_eye,
            delta_eye_arr=None if cfg.delta_eye_arr is None else torch.as_tensor(np.asarray(cfg.delta_eye_arr), device=self.device, dtype=torch.float32),
            delta_eye_open_n=-1, fade_out_keys=cfg.fade_out_keys, fade_type=cfg.fade_type,
            flag_stitching=cfg.flag_stitching, is_image_flag=n_frames == 1, overall_ctrl_info=dict(cfg.overall_ctrl_info)),
            x_s_info=first)
        if n_frames > 1 and st.drive_eye:  # gaze reference = the loop's first frame, as the reference
            st.pose_s = (bin66_to_degree(first["yaw"]), bin66_to_degree(first["pitch"]))
        return st

    # -- stages -----------------------------------------------------------------------------------
    def render_buckets(self) -> tuple[int, ...] | None:
        """The warp + decoder's CUDA-graph buckets in a compiled mode; None in eager mode or with a
        stride (its rows render per stream, outside the buckets)."""
        return None if self._strider is not None else self._crop_runner.padded_sizes()

    def conditioner(self, fps: float) -> FrameQueue:
        """HuBERT rows at 25 fps whatever the output rate (the driver resamples the motion)."""
        check_fps(fps)
        return DittoConditioner(self.audio_encoder, self.device, tuple(self.config.chunksize), HUBERT_BATCH)

    def audio_encoder(self, windows: torch.Tensor) -> torch.Tensor:
        """HuBERT features [B, T, D] of 16 kHz windows [B, 6480] (any device): graphed when it can
        be, through the streams' shared batcher on a server."""
        if self._hubert_runner is None:
            return self.models.hubert(windows)
        windows = to_device(windows, self.device, torch.float32)
        return self.audio_batcher(windows) if self.audio_batcher is not None else self._hubert_runner(windows)

    def driver(self, layer: AvatarLayer, fps: float | None = None) -> FrameQueue:
        """Driving rows at ``fps`` (default 25, the LMDM's rate; others: resample.py)."""
        drv: FrameQueue = DittoDriver(self, layer)
        if fps is not None and check_fps(fps) != FPS:
            drv = MotionResampler(drv, FPS, fps, MOTION_DIM)
        return drv if self._strider is None else self._strider.driver(drv, layer)

    def silence_features(self, n: int) -> torch.Tensor:
        """HuBERT rows of ``n`` frames of silence (the online warm-up), computed once per length."""
        if n not in self._silence:
            with torch.inference_mode():
                feats = wav2feat_offline(torch.zeros(n * SAMPLES_PER_FRAME), self.audio_encoder, tuple(self.config.chunksize),
                                         batch_size=HUBERT_BATCH)
            self._silence[n] = feats.to(self.device, torch.float32)
        return self._silence[n]

    def keypoints(self, layer: AvatarLayer, driving: torch.Tensor, frame_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Motion stitching for a batch: (x_s, x_d), each (B, 21, 3) float32, of driving rows
        shown on source frames ``frame_idx``. Rest rows (``idle_driving``: blink index -1) give
        x_d = x_s."""
        dev = self.device
        d = layer.data
        idx = frame_idx.to(dev)
        rows = driving.to(dev, torch.float32)
        idle = rows[:, 2 * MOTION_DIM] < -0.5
        rows = torch.where(idle[:, None], d["rest_row"], rows)
        x_src = d["x_s"].index_select(0, idx)
        info = d["x_s_info"]
        if layer.n_frames > 1:
            picked = d["x_s_info_rows"].index_select(0, idx)
            info = {k: picked[:, a:b] for k, (a, b) in d["x_s_info_spans"].items()}
        with d["stitch_lock"]:
            st: MotionStitcher = d["stitcher"]
            st.d0 = motion_rows_to_info(rows[:, MOTION_DIM : 2 * MOTION_DIM]) if self.config.relative_d else None
            st.blink_rows = rows[:, 2 * MOTION_DIM].round() if st.delta_eye_arr is not None and st.drive_eye else None
            res = st(info, motion_rows_to_info(rows[:, :MOTION_DIM]), kp_s=x_src)
        return x_src, torch.where(idle[:, None, None], x_src, res.x_d)

    def render(self, layer: AvatarLayer, driving: torch.Tensor, frame_idx: torch.Tensor) -> torch.Tensor:
        return self.render_many([(layer, driving, frame_idx)])[0]

    def render_many(self, items: list[tuple[AvatarLayer, torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """Dense items of any avatars through ONE warp + decoder batch, each then sampled into its
        own ROI; consecutive items of one avatar (many sessions of one presenter) are stitched,
        gathered and sampled as one run (the stitching is row by row: the same keypoints as one
        call per item, far fewer small launches). Stride-mode rows go to the stride renderer,
        which renders all their streams' keyframes in one batch too."""
        dev = self.device
        out: list[torch.Tensor | None] = [None] * len(items)
        strided = [k for k, it in enumerate(items) if self._strider is not None and it[1].shape[-1] == self._strider.width]
        dense_k = sorted(set(range(len(items))) - set(strided))  # dense rows (idle ones in stride mode too)
        with torch.inference_mode():
            if strided:
                assert self._strider is not None
                for k, roi in zip(strided, self._strider.render_many([items[k] for k in strided])):
                    out[k] = roi
            dense = [items[k] for k in dense_k]
            runs: list[tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
            for run in same_layer_runs(dense):
                layer = dense[run[0]][0]
                d = layer.data
                idx = torch.cat([to_device(dense[j][2], dev) for j in run])  # host indices: no sync (rows_on_host)
                driving = torch.cat([to_device(dense[j][1], dev, torch.float32) for j in run])
                x_s, x_d = self.keypoints(layer, driving, idx)
                src_idx = idx.to(d["f_s"].device)
                f_s = d["f_s"].index_select(0, src_idx).to(dev, self.dtype, non_blocking=True)
                grid = d["grid"].index_select(0, src_idx).to(dev, non_blocking=True)
                runs.append(([dense_k[j] for j in run], f_s, x_s, x_d, grid))
            if runs:
                crops = self._crop_runner(*(torch.cat([r[i] for r in runs]) for i in (1, 2, 3)))
                s = 0
                for ks, f_s, _, _, grid in runs:
                    n = int(f_s.shape[0])
                    roi = sample_crops_to_roi(crops[s:s + n], grid)
                    for k, part in zip(ks, torch.split(roi, [int(items[k][2].shape[0]) for k in ks])):
                        out[k] = part
                    s += n
        return out  # type: ignore[return-value]

    def warp_decode(self, f_s: torch.Tensor, x_s: torch.Tensor, x_d: torch.Tensor, with_mask: bool = False
                    ) -> tuple[torch.Tensor, ...]:
        """Warp the source features to the driving keypoints and decode: (decoder output,), plus
        the dense-motion mask averaged over depth (B, 1 + K, h, w) when ``with_mask`` (stride
        mode). Half-precision networks under autocast, keypoints in float32 (like the reference
        wrappers); no autocast weight-cast cache, so the same code can be captured in a CUDA graph."""
        on = self.dtype != torch.float32
        with torch.autocast(device_type=self.device.type, dtype=self.dtype, enabled=on, cache_enabled=False):
            if not with_mask:
                return (self._decoder(self._warp(f_s, x_s, x_d)),)
            feat, mask = self._warp_with_mask(f_s, x_s, x_d)
            return self._decoder(feat), mask

    def _warp_with_mask(self, f_s: torch.Tensor, x_s: torch.Tensor, x_d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The warp network's output plus its dense-motion mask averaged over depth: the same
        computation as ``WarpingNetwork.forward`` (which drops the intermediates)."""
        feat, dense = self._warp.forward_debug(f_s, x_s, x_d)
        return feat, dense["mask"].mean(2)

    def _crops(self, f_s: torch.Tensor, x_s: torch.Tensor, x_d: torch.Tensor) -> torch.Tensor:
        """The dense render's crops: (B, 3, 512, 512) float in [0, 255]."""
        return self.warp_decode(f_s, x_s, x_d)[0].float().clamp_(0, 1).mul_(255.0)

    def use_stream_batchers(self, own_streams: bool = False) -> dict[str, Any]:
        """On a server: the streams' LMDM windows sample in one DDIM run (`use_motion_batcher`) and
        their HuBERT windows encode in one call (each stream's features as alone)."""
        out: dict[str, Any] = {"motion": self.use_motion_batcher(own_stream=own_streams)}
        if self._hubert_runner is not None:
            if self.audio_batcher is None:
                self.audio_batcher = TensorBatcher(self._hubert_runner, max_rows=HUBERT_BUCKET_MAX, name="ditto-hubert",
                                                   device=self.device, own_stream=own_streams)
            out["audio"] = self.audio_batcher
        return out

    def use_motion_batcher(self, max_windows: int = 256, own_stream: bool = False) -> MotionBatcher:
        """Make every stream created from now on sample its LMDM windows through one shared
        `MotionBatcher` (same motion as alone; many streams' windows per DDIM run)."""
        if self.motion_batcher is None:
            self.motion_batcher = MotionBatcher(self.models.lmdm, steps=int(self.config.steps), max_windows=max_windows,
                                                accel=self.front_end_accel, own_stream=own_stream, tf32=self.front_end_tf32)
        return self.motion_batcher

    def calibration_batch(self, n: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``_crops`` inputs with no avatar at hand: the built-in portrait (and its mirror image) through
        this engine's appearance and motion extractors, driven by its own keypoints and by ``n - 1``
        seeded small displacements of them (a face in motion): the activations a real render sees,
        for fixing FP8 scales."""
        from ...builtin import builtin_face_crop

        face = builtin_face_crop(self.config.input_size, scale=2.0)
        x = torch.from_numpy(np.stack([face, face[:, ::-1]])).to(self.device).permute(0, 3, 1, 2).float() / 255.0
        dtype = self.models.dtype
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32):
            f_s = self.models.appearance(x.to(dtype))
            info = {k: v.float().reshape(2, -1) for k, v in zip(INFO_KEYS, self.models.motion(x.to(dtype)))}
        pick = torch.arange(n, device=self.device) % 2
        x_s = transform_info(info).to(torch.float32).index_select(0, pick)
        moves = torch.randn(x_s.shape, generator=torch.Generator().manual_seed(0)).to(self.device)
        moves[0] = 0.0  # the first frame at rest
        return f_s.index_select(0, pick).to(self.dtype), x_s, x_s + moves * (0.05 * x_s.std())

    def warm_up(self) -> float:
        """Compile (with a compile mode) and capture warp + decoder (and stride mode's keyframe
        runner), HuBERT and the LMDM sampler for every batch bucket."""
        f_s = torch.zeros((1, *self.models.feature_volume(self.config.input_size)), device=self.device, dtype=self.dtype)
        kp = torch.zeros((1, NUM_KP, 3), device=self.device)
        lmdm = self.models.lmdm
        p = next(lmdm.parameters())
        with torch.inference_mode():
            seconds = self._crop_runner.warm_up((f_s, kp, kp))
            if self._strider is not None:  # stride mode's keyframes run on a runner of their own
                seconds += self._strider.warm_up((f_s, kp, kp))
            if self._hubert_runner is not None:
                seconds += self._hubert_runner.warm_up((torch.zeros((1, split_len(self.config.chunksize)), device=self.device),))
            kp_cond = torch.zeros((1, lmdm.motion_feat_dim), device=p.device, dtype=p.dtype)
            aud = torch.zeros((1, lmdm.seq_frames, lmdm.audio_feat_dim), device=p.device, dtype=p.dtype)
            seconds += lmdm.ddim_program(int(self.config.steps), 1.0, self.front_end_accel,
                                         self.front_end_tf32).warm_up(kp_cond, aud)
            return seconds

    def idle_driving(self, n: int) -> torch.Tensor | None:
        """The avatar at rest: rows flagged with blink index -1 (all equal, so idle frames can be
        cached by loop index), which ``render`` turns into x_d = x_s of each frame shown."""
        rows = torch.zeros((n, DRIVING_DIM), device=self.device)
        rows[:, 2 * MOTION_DIM] = REST_FLAG
        return rows
