"""Golden checkers for the Ditto motion side: LMDM (denoiser, DDIM), stitching network, motion
stitching, audio windowing (wav2feat) and paste-back (mask, blend).

Every size, salt, step count and flag comes from the case's tensors or metadata.
"""
from __future__ import annotations

import torch

from golden.golden_io import assert_close, assert_uint8_close
from newsstudio.weights.seeded import fill_seeded_

torch.set_grad_enabled(False)


def _outs(t: dict) -> set[str]:
    return {k for k in t if k.startswith("out.")}


def _check_all_compared(t: dict, compared: set[str]) -> None:
    missing = _outs(t) - compared
    assert not missing, f"outputs not compared: {sorted(missing)}"


# -- stitching network ------------------------------------------------------------------------


def _stitching_net(salt: int):
    from newsstudio.engines.ditto.models.stitching_network import StitchingNetwork

    return fill_seeded_(StitchingNetwork(), salt).eval()


def check_stitching_network(t: dict, meta: dict) -> None:
    net = _stitching_net(int(meta["weight_salt"]))
    src, drv = t["in.kp_source"], t["in.kp_driving"]
    drv_before = drv.clone()
    out = net(src, drv)
    assert torch.equal(drv, drv_before), "kp_driving was modified in place"
    assert_close("kp_driving_new", out, t["out.kp_driving_new"], 1e-4)
    assert_close("mlp_delta", net.delta(src, drv), t["out.mlp_delta"], 1e-4)
    _check_all_compared(t, {"out.kp_driving_new", "out.mlp_delta"})


# -- LMDM -------------------------------------------------------------------------------------


def _lmdm(meta: dict):
    from newsstudio.engines.ditto.models.lmdm import LMDM

    kw = meta.get("lmdm_constructor_kwargs", {})
    m = LMDM(
        motion_feat_dim=int(kw.get("motion_feat_dim", 265)),
        audio_feat_dim=int(kw.get("audio_feat_dim", 1103)),
        seq_frames=int(kw.get("seq_frames", 80)),
        guidance_weight=float(meta.get("guidance_weight", 2)),
        clip_denoised=bool(meta.get("clip_denoised", False)),
    )
    fill_seeded_(m.model, int(meta["weight_salt"]))
    return m.eval()


def check_lmdm_denoiser(t: dict, meta: dict) -> None:
    m = _lmdm(meta)
    tc = t["in.time_cond"]
    assert tc.tolist() == list(meta["time_cond"])
    pred_noise, x_start, out_c, out_u = m.predictions(t["in.x"], t["in.cond_frame"], t["in.cond"], tc)
    assert_close("pred_noise", pred_noise, t["out.pred_noise"], 1e-4)
    assert_close("x_start", x_start, t["out.x_start"], 1e-4)
    assert_close("model_out_cond", out_c, t["out.model_out_cond"], 1e-4)
    assert_close("model_out_uncond", out_u, t["out.model_out_uncond"], 1e-4)
    # the single-branch forward (reference semantics of cond_drop_prob 0 / 1) agrees too
    one_c = m.model(t["in.x"], t["in.cond_frame"], t["in.cond"], tc, cond_drop_prob=0.0)
    one_u = m.model(t["in.x"], t["in.cond_frame"], t["in.cond"], tc, cond_drop_prob=1.0)
    assert_close("forward(cond_drop_prob=0)", one_c, t["out.model_out_cond"], 1e-4)
    assert_close("forward(cond_drop_prob=1)", one_u, t["out.model_out_uncond"], 1e-4)
    _check_all_compared(t, {"out.pred_noise", "out.x_start", "out.model_out_cond", "out.model_out_uncond"})


def check_lmdm_ddim(t: dict, meta: dict) -> None:
    from newsstudio.engines.ditto.ddim import DDIMSampler, DDIMTrace, cosine_alphas_cumprod, ddim_plan

    steps = int(meta["sampling_timesteps"])
    eta = float(meta["eta"])
    m = _lmdm(meta)
    n_t = int(meta["n_timestep"])
    ac = cosine_alphas_cumprod(n_t)
    assert_close("schedule.alphas_cumprod", ac, t["out.schedule.alphas_cumprod"], 1e-6)
    assert torch.equal(m.alphas_cumprod, ac)

    plan = ddim_plan(m.alphas_cumprod, steps, eta)
    pairs = torch.tensor(plan.time_pairs, dtype=torch.int64)
    assert torch.equal(pairs, t["out.time_pairs"]), f"time pairs {plan.time_pairs}"
    assert [list(p) for p in plan.time_pairs] == meta["time_pairs"]
    assert torch.equal(torch.tensor(plan.times, dtype=torch.int64), t["out.time_cond_per_step"])
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    assert_close("schedule.sigma", f32(plan.sigma), t["out.schedule.sigma"], 1e-6)
    assert_close("schedule.alpha_next_sqrt", f32(plan.alpha_next_sqrt), t["out.schedule.alpha_next_sqrt"], 1e-6)
    # entry 0 of c is float32 cancellation noise in the reference (README S4): informative only
    c_ref = t["out.schedule.c"]
    assert c_ref.shape[0] == len(plan.c)
    if c_ref.shape[0] > 1:
        assert_close("schedule.c[1:]", f32(plan.c[1:]), c_ref[1:], 1e-6)
    assert all(torch.isfinite(f32(plan.c))) and plan.c[0] >= 0.0

    sampler = DDIMSampler(m, steps=steps, eta=eta, generator=torch.Generator().manual_seed(0))
    sampler.setup(steps, step_noise=t["in.step_noise"])
    trace = DDIMTrace([], [], [])
    result = sampler.sample(t["in.kp_cond"], t["in.aud_cond"], x_T=t["in.x_T"], trace=trace)
    assert_close("result", result, t["out.result"], 2e-4)
    assert_close("x_in_per_step", torch.stack(trace.x_in), t["out.x_in_per_step"], 2e-4)
    compared = {
        "out.result", "out.x_in_per_step", "out.time_pairs", "out.time_cond_per_step",
        "out.schedule.alphas_cumprod", "out.schedule.sigma", "out.schedule.alpha_next_sqrt", "out.schedule.c",
    }
    for name, seq in (("x_start_per_step", trace.x_start), ("pred_noise_per_step", trace.pred_noise)):
        if f"out.{name}" in t:
            assert_close(name, torch.stack(seq), t[f"out.{name}"], 2e-4)
            compared.add(f"out.{name}")
    _check_all_compared(t, compared)


# -- motion stitching ----------------------------------------------------------------------------


def check_motion_stitch(t: dict, meta: dict) -> None:
    from newsstudio.engines.ditto.motion_stitch import (
        MotionStitchConfig, MotionStitcher, motion_rows_to_info, source_kp_cond,
    )

    sk = dict(meta["setup_kwargs"])
    n = int(meta["num_frames"])
    assert sk.get("ch_info") is None and sk.get("d0") is None
    eye_arr = sk.get("delta_eye_arr")
    if isinstance(eye_arr, str):  # a reference to an input tensor of the case
        eye_arr = t[eye_arr]
    cfg = MotionStitchConfig(
        N_d=int(sk["N_d"]),
        use_d_keys=sk["use_d_keys"],
        relative_d=bool(sk["relative_d"]),
        drive_eye=sk["drive_eye"],
        delta_eye_arr=eye_arr,
        delta_eye_open_n=sk["delta_eye_open_n"],
        fade_out_keys=tuple(sk["fade_out_keys"]),
        fade_type=sk["fade_type"],
        flag_stitching=bool(sk["flag_stitching"]),
        is_image_flag=bool(sk["is_image_flag"]),
        overall_ctrl_info=dict(sk["overall_ctrl_info"] or {}),
    )
    x_s_info = {k[len("in.x_s_info."):]: v for k, v in t.items() if k.startswith("in.x_s_info.")}
    stitcher = MotionStitcher(_stitching_net(int(meta["weight_salt"])))
    stitcher.setup(cfg, x_s_info=x_s_info)
    stitcher.set_Nd(int(meta["set_Nd"]))
    per_frame = {int(k): v for k, v in meta["per_frame_ctrl_kwargs"].items()}
    ctrl = [per_frame.get(i, {}) for i in range(n)]
    x_d_info = motion_rows_to_info(t["in.motion_seq"])
    assert x_d_info["exp"].shape[0] == n

    # feed the frames in two blocks to exercise the carried state (d0, fade target, blink counter)
    cut = max(1, n // 3)
    video = not cfg.is_image_flag
    parts = []
    for a, b in ((0, cut), (cut, n)):
        src = {k: v[a:b] for k, v in x_s_info.items()} if video else x_s_info
        parts.append(stitcher({k: v for k, v in src.items()}, {k: v[a:b] for k, v in x_d_info.items()}, ctrl[a:b]))
    cat = lambda f: torch.cat([f(p) for p in parts])  # noqa: E731
    shp = t["out.x_d"].shape
    checks = {
        "out.x_s": cat(lambda p: p.x_s.expand(p.x_d.shape[0], -1, -1)).reshape(shp),
        "out.x_d_before_stitch": cat(lambda p: p.x_d_before_stitch).reshape(shp),
        "out.x_d": cat(lambda p: p.x_d).reshape(shp),
        "out.kp_cond_from_source": source_kp_cond(x_s_info),
    }
    for k in ("pitch", "yaw", "roll"):
        checks[f"out.x_d_info_final.{k}_deg"] = cat(lambda p, k=k: p.x_d_info[k]).reshape(n, 1)
    for k in ("t", "exp", "scale", "kp"):
        ref = t[f"out.x_d_info_final.{k}"]
        checks[f"out.x_d_info_final.{k}"] = cat(lambda p, k=k: p.x_d_info[k]).reshape(ref.shape)
    for name, val in checks.items():
        assert_close(name, val, t[name], 1e-6 if name == "out.kp_cond_from_source" else 1e-4)
    compared = set(checks)
    if "out.delta_eye_idx" in t:
        assert torch.equal(torch.tensor(stitcher.blink_idx, dtype=torch.int64), t["out.delta_eye_idx"]), stitcher.blink_idx
        used = [i for p in parts for i in p.blink_idx]
        assert used == [stitcher.blink_idx[i % len(stitcher.blink_idx)] for i in range(n)]
        compared.add("out.delta_eye_idx")
    _check_all_compared(t, compared)


# -- wav2feat -----------------------------------------------------------------------------------

_STANDIN_CACHE: dict[int, object] = {}


def _hubert_standin(salt: int):
    """The README's stand-in: transformers HubertModel with the manifest's config, seeded."""
    import json

    from golden.golden_io import GOLDEN_DIR
    from newsstudio.engines.ditto.wav2feat import HubertEncoder

    if salt not in _STANDIN_CACHE:
        man = json.loads((GOLDEN_DIR / "ditto" / "manifest_HubertModel_standin.json").read_text())
        cfg = {k: v for k, v in man["config"].items() if k not in ("transformers_version", "model_type")}
        enc = HubertEncoder.from_config(attn_implementation="sdpa", **cfg)
        fill_seeded_(enc.model, salt)
        _STANDIN_CACHE[salt] = enc.fold_().eval()  # as the engine runs it: weight norm folded once
    return _STANDIN_CACHE[salt]


def _replay_encoder(hidden: torch.Tensor, windows: torch.Tensor):
    """Encoder that returns the stored stand-in output of each (exactly matching) window."""

    def enc(w: torch.Tensor) -> torch.Tensor:
        out = []
        for row in w:
            hit = [i for i in range(windows.shape[0]) if torch.equal(windows[i], row)]
            assert hit, "window not among the reference windows"
            out.append(hidden[hit[0]])
        return torch.stack(out)

    return enc


def _check_wav2feat(t: dict, meta: dict, online: bool) -> None:
    from newsstudio.engines.ditto import wav2feat as w2f

    assert int(meta["sr"]) == w2f.SAMPLE_RATE
    cs = tuple(int(c) for c in meta["chunksize"])
    audio = t["in.audio"]
    assert w2f.split_len(cs) == int(meta["split_len"])
    if online:
        wins = w2f.StreamingWav2Feat(lambda w: w, cs).windows_for(audio)
    else:
        wins, n_f = w2f.offline_windows(audio, cs)
        assert n_f == int(meta["num_frames"])
    assert torch.equal(wins, t["out.chunks"]), "windows differ"

    model = _hubert_standin(int(meta["weight_salt"]))
    memo: dict[bytes, torch.Tensor] = {}

    def enc(w: torch.Tensor) -> torch.Tensor:  # the stand-in, one window per call, memoised
        out = []
        for row in w:
            key = row.numpy().tobytes()
            if key not in memo:
                memo[key] = model(row[None])[0]
            out.append(memo[key])
        return torch.stack(out)

    hidden = enc(wins)
    assert_close("standin_hidden_per_chunk", hidden, t["out.standin_hidden_per_chunk"], 1e-4)

    if online:
        # stream the PCM in uneven pieces: the features must not depend on the chunking
        s = w2f.StreamingWav2Feat(enc, cs, batch_size=1)
        pieces, pos, step = [], 0, 1
        while pos < audio.shape[0]:
            step = step * 3 + 777
            pieces.append(s.push(audio[pos : pos + step]))
            pos += step
        pieces.append(s.finish())
        feat = torch.cat([p for p in pieces if p.numel()])
        replay = w2f.wav2feat_online(audio, _replay_encoder(t["out.standin_hidden_per_chunk"], t["out.chunks"]), cs)
    else:
        feat = w2f.wav2feat_offline(audio, enc, cs)
        replay = w2f.wav2feat_offline(audio, _replay_encoder(t["out.standin_hidden_per_chunk"], t["out.chunks"]), cs)
    assert_close("feat", feat, t["out.feat"], 1e-4)
    assert_close("feat (stored stand-in output)", replay, t["out.feat"], 1e-6)
    _check_all_compared(t, {"out.chunks", "out.feat", "out.standin_hidden_per_chunk"})


def check_wav2feat_offline(t: dict, meta: dict) -> None:
    _check_wav2feat(t, meta, online=False)


def check_wav2feat_online(t: dict, meta: dict) -> None:
    _check_wav2feat(t, meta, online=True)


# -- paste-back -----------------------------------------------------------------------------------


def check_get_mask(t: dict, meta: dict) -> None:
    from newsstudio.engines.ditto.putback import get_mask

    for name, kw in meta["calls"].items():
        ref = t[f"out.{name}"]
        out = torch.from_numpy(get_mask(int(kw["W"]), int(kw["H"]), float(kw["ratio_w"]), float(kw["ratio_h"])))
        assert out.shape == ref.shape and out.dtype == ref.dtype, f"{name}: {tuple(out.shape)} {out.dtype}"
        d = (out - ref).abs().max().item()
        assert d <= 1e-6, f"{name}: max |diff| {d:.3e}"
    _check_all_compared(t, {f"out.{n}" for n in meta["calls"]})


def check_putback(t: dict, meta: dict) -> None:
    from newsstudio.engines.ditto.putback import PutBack, blend_numpy, blend_torch

    frame = t["in.frame_rgb"].numpy()
    render = t["in.render_image"].numpy()
    m_c2o = t["in.M_c2o"].numpy()
    size = render.shape[0]
    assert torch.allclose(torch.linalg.inv(t["in.M_o2c"].double()).float(), t["in.M_c2o"], atol=1e-4)
    pb = PutBack(crop_size=size)
    mask_w, frame_w = pb.warp(frame.shape, render, m_c2o)
    assert_close("mask_warped", torch.from_numpy(mask_w), t["out.mask_warped"], 1e-5)
    assert_close("frame_warped", torch.from_numpy(frame_w), t["out.frame_warped"], 1e-5)
    result = pb(frame, render, m_c2o)
    assert result.dtype == frame.dtype
    for name in ("result", "result_numpy_variant"):
        assert_uint8_close(name, torch.from_numpy(result), t[f"out.{name}"], 1, 0.001)
    # the blend alone, fed the reference's warped inputs, is exact (numpy and torch)
    ref_blend = blend_numpy(t["out.mask_warped"].numpy(), t["out.frame_warped"].numpy(), frame)
    assert_uint8_close("blend(reference warps)", torch.from_numpy(ref_blend), t["out.result"], 0, 0.0)
    tb = blend_torch(t["out.mask_warped"], t["out.frame_warped"], t["in.frame_rgb"])
    assert_uint8_close("blend_torch(reference warps)", tb, t["out.result"], 0, 0.0)
    import cv2

    if int(cv2.__version__.split(".")[0]) >= 5:  # OpenCV 5's warp is the exact bilinear too
        pb_cv = PutBack(crop_size=size, backend="cv2")
        mask_c, frame_c = pb_cv.warp(frame.shape, render, m_c2o)
        assert_close("mask_warped (cv2)", torch.from_numpy(mask_c), t["out.mask_warped"], 1e-5)
        assert_close("frame_warped (cv2)", torch.from_numpy(frame_c), t["out.frame_warped"], 1e-5)
    _check_all_compared(t, {"out.mask_warped", "out.frame_warped", "out.result", "out.result_numpy_variant"})


CHECKS = {
    "get_mask": check_get_mask,
    "putback": check_putback,
    "wav2feat_offline": check_wav2feat_offline,
    "wav2feat_online": check_wav2feat_online,
    "motion_stitch": check_motion_stitch,
    "stitching_network": check_stitching_network,
    "lmdm_denoiser": check_lmdm_denoiser,
    "lmdm_ddim": check_lmdm_ddim,
}
