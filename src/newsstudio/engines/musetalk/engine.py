"""The MuseTalk engine: Whisper prompts -> one UNet step on the avatar's latents -> VAE decode.

Stages (engines/base.py):

1. ``conditioner(fps)``: incremental Whisper-tiny features (``audio_features.StreamingAudioFeatures``,
   2 frames of look-ahead) -> per-frame prompts ``(50, 384)``: 10 rows of 20 ms x 5 hidden states,
   the audio of frames i-2 .. i+2. The positional encoding is added in ``render``.
2. driver: identity.
3. ``render``: UNet at timestep 0 on ``latents[frame]`` (masked | reference, from the prebake)
   with the prompts, VAE decode, rounded to 8-bit levels like the official ``decode_latents``,
   then resized into each frame's face box inside the fixed ROI with ``grid_sample`` (bilinear,
   = cv2 INTER_LINEAR), all on the device: (B, Hr, Wr, 3) float RGB in [0, 255].
4. the runner splices the ROI with the prebaked alpha (BiSeNet jaw mask or landmark jaw mask,
   feathered like the realtime script).

Differences from the official realtime script, on purpose: every generated frame is used (its
blending thread drops the last one); frames without a face use the nearest face (the packet's
landmarks already do this) instead of desynchronising the latent and frame cycles; latents are
the posterior mean unless sampling is asked for (the official draws from the global RNG); boxes are
clipped to the frame; non-integer frame rates (29.97) use the exact frame times instead of
``int(fps)``.
"""
from __future__ import annotations

import copy
import os
import sys
import threading
from collections import OrderedDict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ...accel.group_norm_nhwc import fuse_following_silu_, with_nhwc_group_norms
from ...accel.igemm_conv import CALIBRATED_MODES, ENGINE_FP8_HEADROOM, calibrate_fp8_, with_triton_convs
from ...accel.precision import to_channels_last_
from ...accel.settings import resolve_accel
from ...accel.static import GRAPH_MODES, BucketedRunner, render_buckets, static_buckets
from ...accel.upsample_conv import with_phase_upsampling
from ...avatar.packet import Packet, PacketError
from ..base import AvatarLayer, Engine, FrameQueue, neural_defaults, same_layer_runs, warn_random_weights
from ..batching import TensorBatcher
from ..model_cache import ModelCache
from .audio_features import PIECE_SAMPLES, SAMPLE_RATE, PositionalEncoding, audio_prompts, piece_hidden_states
from .batch_graphs import BatchGraphs
from .frame_queues import MuseTalkConditioner, feature_step_rows
from .face_rows import resolve_face_rows, store_upper_stats, stored_upper_stats
from .lower_face_decoder import LowerFaceDecoder
from .prebake import (PrebakeOptions, box_grid_axes, first_blended_face_rows, grid_from_axes, prebake_mismatch,
                      prebake_musetalk, resize_with_grid, vae_fingerprint)
from .vae import decoded_levels, latents_for_unet, scaling_factor_of
from .weights import (
    UNET_CONFIG,
    VAE_CONFIG,
    MuseTalkModels,
    MuseTalkWeightsMissing,
    load_official,
    random_unet,
    random_vae,
    random_whisper_encoder,
)

#: Small architectures for tests only (same structure, far fewer channels): never for real output.
TINY_UNET_CONFIG: dict[str, Any] = {**UNET_CONFIG, "block_out_channels": [32, 64, 64, 64], "layers_per_block": 1}
TINY_VAE_CONFIG: dict[str, Any] = {**VAE_CONFIG, "block_out_channels": [32, 32, 64, 64], "layers_per_block": 1}

LAYER_CACHE_SIZE = 4  # avatars kept on the device at once (each: latents + float masks, ~1 MB/frame at 1080p)
BISENET_FILE = Path("face-parse-bisent") / "79999_iter.pth"

_MODELS: ModelCache[MuseTalkModels] = ModelCache(2)


def _cache_key(weights: str, models_dir: Path | None, version: str, salt: int, device: torch.device, dtype: torch.dtype,
               unet_config: dict | None, vae_config: dict | None, channels_last: bool) -> tuple:
    return (weights, str(models_dir.resolve()) if models_dir else None, version, salt, str(device), str(dtype),
            repr(sorted((unet_config or {}).items())), repr(sorted((vae_config or {}).items())), channels_last)


def get_models(weights: str, models_dir: Path | None, version: str, salt: int, device: torch.device,
               dtype: torch.dtype, unet_config: dict | None = None, vae_config: dict | None = None,
               channels_last: bool = False) -> MuseTalkModels:
    """Build or load the networks once per process (the UNet alone has 850M parameters): engines
    created with the same settings share them (the CLI, the server and tests create several).
    ``channels_last``: UNet and VAE weights in NHWC (a separate copy: see model_cache)."""

    def build() -> MuseTalkModels:
        if weights == "random":
            m = MuseTalkModels(
                unet=random_unet(salt, device, dtype, config=unet_config),
                vae=random_vae(salt, device, dtype, config=vae_config),
                whisper_encoder=random_whisper_encoder(salt, device, dtype),
                pe=PositionalEncoding().to(device=device, dtype=dtype),
                version=version, device=device, dtype=dtype, random_salt=salt,
            )
        else:
            assert models_dir is not None
            m = load_official(models_dir, version, device, dtype)
        if channels_last:
            to_channels_last_(m.unet)
            to_channels_last_(m.vae)
        return m

    key = _cache_key(weights, models_dir, version, salt, device, dtype, unet_config, vae_config, channels_last)
    return _MODELS.get(key, build)


# ------------------------------------------------------------------------------------- engine

WHISPER_BUCKET_MAX = 16  # 30 s pieces per Whisper call (several live streams' updates at once)


#: The VAE decoder's convs that run in FP8 under ``triton_convs="mixed"``: the full-resolution
#: block (256x256, 128 channels), ~60 % of the decoder's conv time. FP8 (e4m3) on every decoder conv
#: gives 29 dB vs fp32 on seeded weights, whatever the input scales' granularity (per tensor, pixel
#: or channel: the 3-bit mantissa is the error); on this block alone 37 dB.
FP8_SAFE_DECODER_CONVS = "up_blocks.3."


def fp8_safe_decoder_conv(name: str, module: torch.nn.Module) -> bool:
    """``convert_convs_to_triton_``'s filter for `FP8_SAFE_DECODER_CONVS` (names within the decoder)."""
    return name.startswith(FP8_SAFE_DECODER_CONVS)


class MuseTalkEngine(Engine):
    """MuseTalk v1.5 (or v1.0) on one device.

    weights: ``"official"`` (the release layout under ``models``, strictly loaded) or ``"random"``
    (seeded with ``salt``; outputs are marked). mask: ``"auto"`` (BiSeNet when its weights are in
    the models folder, else the landmark jaw mask), ``"bisenet"`` or ``"landmark"``. latent:
    ``"mode"`` (deterministic posterior mean) or ``"sample"`` (seeded with ``seed``).
    ``reprebake``: when a packet's MuseTalk arrays were made with other weights/options, compute
    them again (True) or raise (False). ``accel``: how UNet + decode run on CUDA (``"cudagraph"``
    by default, ``"compile+cudagraph"``, ``"compile"``, ``"eager"``; CPU is eager);
    ``channels_last``: NHWC weights (default: with a compile mode only); ``cudnn_benchmark``: cuDNN
    autotuning (accel/cudnn.py; default on with CUDA); ``conv_rewrites``: the VAE decoder's three
    nearest-2x + 3x3-conv pairs computed as 2x2 phase convolutions (accel/upsample_conv.py: 97 of
    its 622 GFLOP per frame saved, equal up to rounding; the shared VAE itself stays as loaded);
    ``nhwc_norms``: the VAE decoder's GroupNorms by accel/group_norm_nhwc.py's kernels, the SiLU
    that follows most of them in their apply kernel (equal up to rounding; default on with CUDA and
    channels_last: on an H200 the engine ran 497.1 instead of 476.6 frames/s dense, back to back,
    the compiled decoder alone 40.6 instead of 43.1 ms per batch of 32; the UNet keeps PyTorch's
    norms, whose small maps the kernel did slower);
    ``triton_convs``: the VAE decoder's convolutions by the Triton implicit-GEMM kernel
    (accel/igemm_conv.py) in the engine's half precision (``"half"``), in FP8 (Hopper+) with each
    input's scale from its amax on every call (``"fp8"``) or fixed once when the engine is built
    (``"fp8-static"``: from the built-in portrait rendered with silence and speech, with 2x headroom),
    ``"mixed"`` (fp8-static on the full-resolution block, `FP8_SAFE_DECODER_CONVS`, half elsewhere),
    or by cuDNN (``"off"``, the default until the kernel is measured to pay on the GPU); CUDA only.
    ``first_face_row``: which face rows the VAE decoder makes (face_rows.py): by default rows 104-255
    (``"auto"``) on CUDA with a compile mode (dense 596.6 instead of 475.9 frames/s on an H100) and
    the whole face elsewhere; ``0`` the whole face; ``R`` rows ``R``-255 only
    (lower_face_decoder.py: ~73 % of the decoder's FLOPs at 104), the rows the blend uses. The
    skipped rows' GroupNorm statistics come from each avatar frame rendered with the silence prompt
    (made at prebake and stored in the packet, or when the avatar is loaded), an approximation
    (36.9 dB over the blended pixels with seeded weights; benchmarks/lower_face_decoder.py). An
    avatar whose blend reaches above the row renders with the whole face under ``"auto"`` and is
    refused under an explicit ``R``.
    ``static_shapes``: which render buckets are compiled at their own batch size instead of sharing
    one dynamic-batch compilation (accel/static.py `static_buckets`): ``"largest"`` by default on
    CUDA with a compile mode (batch 32: 46.1 instead of 48.7 ms on an H100), ``"all"`` (six
    compilations at warm-up), ``"none"``.
    ``batch_graphs``: a render batch of one avatar gathered and resized by CUDA graphs of its own
    around the face runner's (batch_graphs.py: ~10 torch calls per batch instead of ~50, each a GIL
    hand-off under many live sessions; the same bytes, and 3.4 instead of 10.7-20.3 ms to dispatch a
    batch beside 16 busy threads on an H100). ``None`` (default): built and on where the face runner
    replays CUDA graphs (a switch: ``engine.batch_graphs.enabled``); ``True``: built and on everywhere
    (eager off CUDA); ``False``: not built. On by default since the thirty-third session: 20 live
    sessions on an H100 got 20 and 18 of 20 on time with them (render thread busy 0.15-0.16 of each
    second), 16 of 20 without (0.52; benchmarks/RESULTS.md).
    """

    name = "musetalk"
    sample_rate = SAMPLE_RATE
    #: For finite inputs the runner may push audio in blocks this long: Whisper sees whole 30 s
    #: pieces, so the prompts equal the reference's whole-file ones (0.5 s blocks give streamed
    #: approximations, see audio_features.STREAMING_ERROR_BOUND) and it runs once per piece.
    file_block_s = 30.0

    def __init__(
        self,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        *,
        weights: str = "official",
        models: str | Path | None = None,
        version: str = "v15",
        salt: int = 0,
        mask: str = "auto",
        latent: str = "mode",
        seed: int = 0,
        bbox_shift: int = 0,
        extra_margin: int = 10,
        reprebake: bool = True,
        compile: bool = False,
        accel: str | None = None,
        channels_last: bool | None = None,
        cudnn_benchmark: bool | None = None,
        prebake_batch: int | None = None,
        conv_rewrites: bool = True,
        nhwc_norms: bool | None = None,
        triton_convs: str = "off",
        first_face_row: int | str | None = None,
        static_shapes: str | None = None,
        batch_graphs: bool | None = None,
        feature_step_ms: int | None = None,
        unet_config: dict[str, Any] | None = None,
        vae_config: dict[str, Any] | None = None,
    ):
        device, dtype = neural_defaults(device, dtype, weights)
        super().__init__(device, dtype)
        if mask not in ("auto", "bisenet", "landmark"):
            raise ValueError(f"mask must be 'auto', 'bisenet' or 'landmark', got {mask!r}")
        from ..registry import models_dir as _models_dir

        self.models_dir = _models_dir(models)
        self.weights = weights
        self.salt = int(salt) if weights == "random" else None
        self.random_weights = weights == "random"
        if (unet_config or vae_config) and weights != "random":
            raise ValueError("unet_config/vae_config (test architectures) need weights='random'")
        if self.random_weights:
            warn_random_weights("MuseTalk", self.salt)
        acc = resolve_accel(device, accel, compile, channels_last, cudnn_benchmark, dtype)
        self.accel, self.channels_last, self.cudnn_benchmark = acc.mode, acc.channels_last, acc.cudnn_benchmark
        self.front_end_accel = acc.front_end_mode
        self.models = get_models(weights, None if self.random_weights else self.models_dir, version,
                                 self.salt or 0, device, dtype, unet_config, vae_config, self.channels_last)
        self.version = version
        bisenet_path = self.models_dir / BISENET_FILE
        if mask == "auto":
            mask = "bisenet" if (not self.random_weights and bisenet_path.is_file()) else "landmark"
        elif mask == "bisenet" and not self.random_weights and not bisenet_path.is_file():
            raise MuseTalkWeightsMissing(bisenet_path, "BiSeNet face-parsing weights")
        self.options = PrebakeOptions(version=version, bbox_shift=bbox_shift, extra_margin=extra_margin, mask=mask,
                                      latent=latent, seed=seed)
        self.reprebake = reprebake
        self.prebake_batch = prebake_batch or (16 if device.type == "cuda" else 4)
        self.vae_id = vae_fingerprint(self.models.vae)
        self._scale = 1.0 / scaling_factor_of(self.models.vae)
        self._t0 = torch.zeros(1, dtype=torch.long, device=device)
        self.nhwc_norms = (device.type == "cuda" and self.channels_last) if nhwc_norms is None else bool(nhwc_norms)
        self.conv_rewrites = bool(conv_rewrites)
        vae = self.models.vae
        self._post_quant_conv = vae.post_quant_conv if vae.post_quant_conv is not None else torch.nn.Identity()
        self._vae_decoder = with_phase_upsampling(vae.decoder)[0] if self.conv_rewrites else vae.decoder
        if self.conv_rewrites and self.channels_last:
            to_channels_last_(self._vae_decoder)
        if self.nhwc_norms:
            self._vae_decoder = with_nhwc_group_norms(self._vae_decoder)[0]
            fuse_following_silu_(self._vae_decoder)
        self.triton_convs, self._vae_decoder = with_triton_convs(
            self._vae_decoder, triton_convs, device, copied=self.conv_rewrites or self.nhwc_norms,
            fp8_convs=fp8_safe_decoder_conv)
        # a live stream's Whisper update step (frame_queues.py; None: LIVE_UPDATE_ROWS, read per conditioner)
        self.live_update_rows = None if feature_step_ms is None else feature_step_rows(int(feature_step_ms))
        self.face_rows = resolve_face_rows(first_face_row, device.type, self.accel)
        self._lower_decoder = LowerFaceDecoder(self._vae_decoder, self.face_rows.first_row) if self.face_rows.first_row else None
        # UNet + decode run as one static-shape callable per batch bucket: CUDA graphs remove the
        # ~2,500 kernel launches per call (tens of ms) that dominate small batches. Eager on CPU.
        buckets = render_buckets()
        self.static_buckets = static_buckets(static_shapes, buckets, device.type, self.accel)
        self._face_runner = BucketedRunner(self._faces, self.accel, sizes=buckets, static_sizes=self.static_buckets)
        # with a lower decoder, the whole face for avatars whose blend reaches above its first row
        # (compiled when the first such avatar is loaded; its own function, so its compilations do
        # not count against the face runner's in Dynamo's per-function recompile limit)
        self._whole_face_runner = (BucketedRunner(self._whole_faces, self.accel, sizes=buckets,
                                                  static_sizes=self.static_buckets)
                                   if self._lower_decoder is not None else None)
        graphs_here = self.accel in GRAPH_MODES and device.type == "cuda"
        self.batch_graphs = (BatchGraphs(device, use_graphs=graphs_here, enabled=batch_graphs is not False)
                             if batch_graphs is not False and (graphs_here or batch_graphs) else None)
        # Whisper over whole 30 s pieces (1-4 per call): a fixed shape, ~100 small kernels per run.
        self._whisper_runner = BucketedRunner(partial(piece_hidden_states, self.models.whisper_encoder),
                                              self.front_end_accel, min_bucket=1, max_bucket=WHISPER_BUCKET_MAX)
        self.audio_batcher: TensorBatcher | None = None  # the server's streams share Whisper calls
        self._parser = None
        self._idle: torch.Tensor | None = None
        self._layers: OrderedDict[str, AvatarLayer] = OrderedDict()  # a few avatars stay resident (server)
        self._lock = threading.RLock()
        if self.triton_convs in CALIBRATED_MODES:
            calibrate_fp8_(self._vae_decoder, lambda: self._faces(*self.calibration_batch()), ENGINE_FP8_HEADROOM)

    # -- prebake ----------------------------------------------------------------------------
    def weights_meta(self) -> dict[str, Any]:
        return {"weights": self.weights, "salt": self.salt, "vae_id": self.vae_id}

    def expected_meta(self) -> dict[str, Any]:
        """Engine meta a packet must carry for its MuseTalk arrays to be usable here."""
        return {**self.options.meta(), **self.weights_meta()}

    def face_parser(self):
        """BiSeNet + MuseTalk's mask rules (official weights, or seeded ones with random weights)."""
        if self._parser is None:
            from ...weights.seeded import fill_seeded_
            from .bisenet import BiSeNet, load_bisenet
            from .face_parsing import FaceParser

            if self.random_weights:
                net = fill_seeded_(BiSeNet(), self.salt or 0).to(self.device).eval()
            else:
                net = load_bisenet(self.models_dir / BISENET_FILE, device=self.device)
            cheeks = (90, 90) if self.version == "v15" else (80, 80)
            self._parser = FaceParser(net, *cheeks)
        return self._parser

    def prebake(self, packet: Packet, progress: bool = True, force: bool = False) -> Packet:
        """Add MuseTalk's arrays (no-op when the packet already has them for these weights/options),
        and with a lower-face decoder the skipped rows' statistics (face_rows.py)."""
        try:
            if force or prebake_mismatch(packet, self.expected_meta()) is not None:
                parser = self.face_parser() if self.options.mask == "bisenet" else None
                # Encode in float32 even when rendering in float16: the latents are made once and stored
                # as float16 (measured error in the meta); a transient fp32 copy of the VAE costs ~0.3 GB.
                vae = self.models.vae if self.dtype == torch.float32 else torch.nn.Module.to(copy.deepcopy(self.models.vae), dtype=torch.float32)
                packet = prebake_musetalk(packet, vae, self.options, parser=parser, weights_meta=self.weights_meta(),
                                          batch_size=self.prebake_batch, progress=progress)
            if self._lower_decoder is not None and self._upper_stats_needed(packet):
                latents = packet.tensor("musetalk/latents").to(self.device).to(self.dtype)
                stats = self._upper_stats(latents, progress)
                packet = store_upper_stats(packet, stats.cpu().numpy(), self._upper_stats_key())
            return packet
        except PermissionError as e:
            raise PacketError(f"avatar packet {packet.path} is not writable, so MuseTalk's arrays cannot be added "
                              f"({e}); prebake it where it can be written (`newsstudio prebake ... --engines musetalk`)") from e

    def _upper_stats_key(self) -> dict[str, Any]:
        """What the stored upper-row statistics depend on besides the packet's own latents."""
        return {"first_face_row": self.first_face_row, "version": self.version, "dtype": str(self.dtype).removeprefix("torch."),
                **self.weights_meta()}

    def _upper_stats_shape(self, n: int) -> tuple[int, ...]:
        assert self._lower_decoder is not None
        return (n, len(self._lower_decoder.plan.norm_starts), self._lower_decoder.groups, 2)

    def _upper_stats_needed(self, packet: Packet) -> bool:
        """The packet lacks this engine's upper-row statistics and its blend allows the lower decoder."""
        if stored_upper_stats(packet, self._upper_stats_key(), self._upper_stats_shape(packet.n_frames)) is not None:
            return False
        # the uint8 masks as stored: only their non-zero rows count (no float copy of every frame's mask)
        return self._blend_first_row(packet, packet.tensor("musetalk/mask"), packet.tensor("musetalk/boxes")) >= self.first_face_row

    # -- avatar -----------------------------------------------------------------------------
    def load_avatar(self, packet: Packet) -> AvatarLayer:
        with self._lock:
            expected = self.expected_meta()
            packet = self.usable_packet(packet, lambda p: prebake_mismatch(p, expected), self.reprebake)
            key = str(Path(packet.path).resolve())
            sha = "/".join(packet.specs[a].sha256 for a in ("musetalk/latents", "musetalk/mask", "musetalk/boxes"))
            cached = self._layers.get(key)
            if cached is not None and cached.data.get("latents_sha") == sha:
                self._layers.move_to_end(key)
                return cached
            layer = self._make_layer(packet)
            layer.data["latents_sha"] = sha
            self._layers[key] = layer
            while len(self._layers) > LAYER_CACHE_SIZE:
                self._layers.popitem(last=False)
            return layer

    def _make_layer(self, packet: Packet) -> AvatarLayer:
        dev = self.device
        wr, hr = (int(v) for v in packet.engine_meta("musetalk")["roi"])
        latents = packet.tensor("musetalk/latents").to(dev).to(self.dtype)
        origins = packet.tensor("musetalk/origins").to(dev, torch.long)
        masks = packet.tensor("musetalk/mask").to(dev).to(torch.float32).div_(255.0)
        boxes = packet.tensor("musetalk/boxes").to(dev, torch.float32)
        n = packet.n_frames
        if latents.shape != (n, 8, 32, 32) or masks.shape != (n, hr, wr) or origins.shape != (n, 2) or boxes.shape != (n, 4):
            raise PacketError(f"avatar {packet.id!r}: MuseTalk arrays have inconsistent shapes")
        gx, gy = box_grid_axes(boxes, (hr, wr))  # once per avatar: each render batch gathers its frames' rows
        data = {"latents": latents, "grid_x": gx, "grid_y": gy}
        if self._lower_decoder is not None:
            if self._blend_first_row(packet, masks, boxes) >= self.first_face_row:
                stored = stored_upper_stats(packet, self._upper_stats_key(), self._upper_stats_shape(n))
                data["upper_stats"] = (torch.from_numpy(np.array(stored)).to(dev) if stored is not None
                                       else self._computed_upper_stats(packet, latents))
            else:
                self._warm_whole_face_runner()
        return AvatarLayer(self.name, packet, dev, (hr, wr), origins, masks, data)

    def _blend_first_row(self, packet: Packet, masks: torch.Tensor, boxes: torch.Tensor) -> int:
        """The first face row the avatar's blend shows. An explicit `first_face_row` below it
        refuses the avatar; ``"auto"`` renders it with the whole face (and says so on stderr)."""
        first = int(first_blended_face_rows(masks, boxes).min())
        if first < self.first_face_row and self.face_rows.strict:
            raise PacketError(f"avatar {packet.id!r}: its blend mask uses face rows from {first}, but this engine "
                              f"decodes rows {self.first_face_row}-255 only (first_face_row); use first_face_row <= {first}, "
                              "'auto' or 0 (the whole face)")
        if first < self.first_face_row:
            print(f"musetalk: avatar {packet.id!r} blends face rows from {first}, above row {self.first_face_row}: "
                  "it renders with the whole-face decoder (slower)", file=sys.stderr)
        return first

    def _computed_upper_stats(self, packet: Packet, latents: torch.Tensor) -> torch.Tensor:
        """The upper-row statistics of a packet that lacks them, kept in it where it is writable so
        that the next process reads them (a packet prebaked without a lower decoder, e.g. by
        `newsstudio prebake` on the CPU); a read-only packet just gets them again next time."""
        stats = self._upper_stats(latents)
        if os.access(packet.path, os.W_OK):
            try:
                store_upper_stats(packet, stats.cpu().numpy(), self._upper_stats_key())
            except OSError as e:
                print(f"musetalk: could not store the upper-face statistics in {packet.path} ({e})", file=sys.stderr)
        return stats

    def _warm_whole_face_runner(self) -> None:
        """Compile the whole-face render when the first avatar that needs it is loaded, not mid-stream."""
        runner = self._whole_face_runner
        if runner is not None and not runner.runners and self.accel != "eager":
            with torch.inference_mode():
                runner.warm_up(self.example_face_inputs(1, whole_face=True))

    def _upper_stats(self, latents: torch.Tensor, progress: bool = True) -> torch.Tensor:
        """Per avatar frame, the GroupNorm statistics of the face rows the lower decoder skips, from
        the frame rendered with the silence prompt: (N, K, G, 2) float32 on the device."""
        assert self._lower_decoder is not None
        idle = self.idle_prompt().to(self.device, self.dtype)
        n, out = latents.shape[0], []
        bar = tqdm(total=n, desc="musetalk upper-face statistics", unit="f", disable=not progress or n <= self.prebake_batch,
                   file=sys.stderr)
        with torch.inference_mode():
            for b0 in range(0, n, self.prebake_batch):
                lat = latents[b0:b0 + self.prebake_batch]
                z = self._decoder_input(lat, idle[None].expand(lat.shape[0], -1, -1))
                out.append(self._lower_decoder.record_upper_stats(z)[1])
                bar.update(lat.shape[0])
        bar.close()
        return torch.cat(out)

    def render_buckets(self) -> tuple[int, ...] | None:
        """The face runner's CUDA-graph buckets in a compiled mode (eager runs a batch as it is)."""
        return self._face_runner.padded_sizes()

    # -- stages -----------------------------------------------------------------------------
    def conditioner(self, fps: float) -> FrameQueue:
        return MuseTalkConditioner(self.models.whisper_encoder, fps, self.sample_rate, states_fn=self.whisper_states,
                                   update_rows=self.live_update_rows)

    def whisper_states(self, pieces: torch.Tensor) -> torch.Tensor:
        """Whisper hidden states of zero-padded 30 s pieces (log-mel and encoder: one graph when it
        can be), through the streams' shared batcher on a server."""
        return self.audio_batcher(pieces) if self.audio_batcher is not None else self._whisper_runner(pieces)

    def use_stream_batchers(self, own_streams: bool = False) -> dict[str, TensorBatcher]:
        """Live streams re-encode their current 30 s Whisper piece every 100 ms; on a server their
        encoder runs share one batched call (same features as alone: the pieces are independent)."""
        if self.audio_batcher is None:
            self.audio_batcher = TensorBatcher(self._whisper_runner, max_rows=WHISPER_BUCKET_MAX, name="musetalk-whisper",
                                               device=self.device, own_stream=own_streams)
        return {"audio": self.audio_batcher}

    def render(self, layer: AvatarLayer, driving: torch.Tensor, frame_idx: torch.Tensor) -> torch.Tensor:
        return self.render_many([(layer, driving, frame_idx)])[0]

    def render_many(self, items: list[tuple[AvatarLayer, torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """All items' faces in one UNet + decode batch (any mix of avatars: the networks see 256x256
        crops only), then resized into their avatar's boxes: consecutive items of one avatar (the
        usual shared batch: many sessions of one presenter) in one gather and one resize, so the
        render thread's per-batch work does not grow with the number of sessions."""
        dev = self.device
        with torch.inference_mode():
            runs = same_layer_runs(items)
            if self.batch_graphs is not None and len(runs) == 1:
                out = self._render_one_avatar(items)
                if out is not None:
                    return out
            idxs = [torch.cat([items[k][2].to(dev) for k in run]) for run in runs]

            def gather(key: str) -> torch.Tensor:  # the batch's rows of a per-avatar-frame tensor
                return torch.cat([items[run[0]][0].data[key].index_select(0, idx) for run, idx in zip(runs, idxs)])

            inputs = (gather("latents"), torch.cat([d.to(dev, self.dtype) for _, d, _ in items]))
            if self._whole_face_runner is not None and any("upper_stats" not in items[run[0]][0].data for run in runs):
                faces = self._whole_face_runner(*inputs)  # an avatar whose blend needs the whole face: all of the batch
            else:
                if self._lower_decoder is not None:
                    inputs += (gather("upper_stats"),)
                faces = self._face_runner(*inputs)
            out: list[torch.Tensor] = []
            s = 0
            for run, idx in zip(runs, idxs):
                layer, n = items[run[0]][0], int(idx.shape[0])
                grid = grid_from_axes(layer.data["grid_x"].index_select(0, idx), layer.data["grid_y"].index_select(0, idx))
                resized = resize_with_grid(faces[s:s + n], grid)
                out += list(torch.split(resized, [int(items[k][2].shape[0]) for k in run]))
                s += n
            return out

    def _render_one_avatar(self, items: list[tuple[AvatarLayer, torch.Tensor, torch.Tensor]]) -> list[torch.Tensor] | None:
        """`render_many` of a batch of one avatar through `batch_graphs` (None where it does not apply)."""
        layer = items[0][0]
        whole = self._whole_face_runner is not None and "upper_stats" not in layer.data
        runner = self._whole_face_runner if whole else self._face_runner
        keys = ("latents", "upper_stats") if self._lower_decoder is not None and not whole else ("latents",)
        return self.batch_graphs.render(runner, layer, keys, [d for _, d, _ in items], [i for _, _, i in items],
                                        self.dtype)

    @property
    def first_face_row(self) -> int:
        return 0 if self._lower_decoder is None else self._lower_decoder.first_row

    def _decoder_input(self, latents: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        """UNet step, then AutoencoderKL.decode's scaling and post_quant_conv."""
        pred = self.models.unet(latents, self._t0, encoder_hidden_states=self.models.pe(prompts)).sample
        return self._post_quant_conv(pred * self._scale)

    def _faces(self, latents: torch.Tensor, prompts: torch.Tensor, upper_stats: torch.Tensor | None = None) -> torch.Tensor:
        """UNet step + VAE decode + the official post-processing: (B, 3, 256, 256) float in [0, 255].
        With `first_face_row` and ``upper_stats``, rows above it are not decoded and stay 0 (the
        blend never shows them: `_check_blend_rows`)."""
        z = self._decoder_input(latents, prompts)
        if self._lower_decoder is not None and upper_stats is not None:
            decoded = torch.nn.functional.pad(self._lower_decoder(z, upper_stats), (0, 0, self.first_face_row, 0), value=-1.0)
        else:
            decoded = self._vae_decoder(z)  # AutoencoderKL.decode, untiled
        return decoded_levels(decoded)  # the official decode_latents' rounding

    def _whole_faces(self, latents: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        """`_faces` with every row decoded (the whole-face runner's own function: see __init__)."""
        return self._faces(latents, prompts)

    def calibration_batch(self, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
        """``_faces`` inputs with no avatar at hand: the built-in portrait's face (and its mirror image)
        through this engine's VAE, with the prompts of silence and of ``n - 1`` frames of the built-in
        speech: the activations a real render sees, for fixing FP8 scales."""
        from ...builtin import builtin_audio, builtin_face_crop
        from ...media.audio import load_audio

        face = builtin_face_crop(256)
        faces = np.stack([face, face[:, ::-1]])
        latents = latents_for_unet(self.models.vae, faces, channel_order="rgb")
        speech = load_audio(builtin_audio("builtin:hello")).mono().resampled(SAMPLE_RATE).samples[0]
        spoken = audio_prompts(self.models.whisper_encoder, speech, 25)
        picks = torch.linspace(0, spoken.shape[0] - 1, n - 1).round().long().to(spoken.device)
        prompts = torch.cat([self.idle_prompt()[None].to(spoken.device, spoken.dtype), spoken.index_select(0, picks)])
        return latents.repeat(-(-n // 2), 1, 1, 1)[:n], prompts.to(self.device, self.dtype)

    def warm_up(self) -> float:
        """Compile (with a compile mode) and capture UNet + decode and Whisper for every batch bucket."""
        with torch.inference_mode():
            seconds = self._face_runner.warm_up(self.example_face_inputs(1))
            piece = torch.zeros(1, PIECE_SAMPLES, device=self.device)
            return seconds + self._whisper_runner.warm_up((piece,))

    def example_face_inputs(self, batch: int, whole_face: bool = False) -> tuple[torch.Tensor, ...]:
        """``_faces`` inputs of ``batch`` rows (zero latents, the silence prompt, and with
        `first_face_row` unless ``whole_face`` unit upper statistics): what warm-up compiles and captures with."""
        latents = torch.zeros((batch, 8, 32, 32), device=self.device, dtype=self.dtype)
        inputs: tuple[torch.Tensor, ...] = (latents, self.idle_prompt()[None].to(self.dtype).expand(batch, -1, -1).contiguous())
        if self._lower_decoder is not None and not whole_face:
            k, g = len(self._lower_decoder.plan.norm_starts), self._lower_decoder.groups
            inputs += (torch.ones((batch, k, g, 2), device=self.device, dtype=torch.float32),)
        return inputs

    def idle_prompt(self) -> torch.Tensor:
        """Prompts of silence (1 s of zeros, a frame whose window lies inside it), computed once:
        MuseTalk has no closed-mouth code, so idle frames render what silence renders."""
        if self._idle is None:
            wave = torch.zeros(SAMPLE_RATE, dtype=torch.float32)
            prompts = audio_prompts(self.models.whisper_encoder, wave, 25)
            self._idle = prompts[prompts.shape[0] // 2].contiguous()
        return self._idle

    def idle_driving(self, n: int) -> torch.Tensor | None:
        return self.idle_prompt().unsqueeze(0).expand(n, -1, -1)
