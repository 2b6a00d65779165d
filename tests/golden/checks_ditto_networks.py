"""Golden checkers for the four big Ditto image networks (README sections 2.1-2.4).

Each checker builds our module with constructor defaults (as the official loader does), fills it
with `fill_seeded_(m, salt=meta['weight_salt'])`, runs it in eval mode on the case's `in.*`
tensors and compares EVERY `out.*` tensor of the case with the README tolerance. Sizes come from
the input tensors only.
"""
from __future__ import annotations

import torch

from golden.golden_io import assert_close
from newsstudio.weights.seeded import fill_seeded_

# Per-output relative-error tolerances from golden/ditto/README.md (sections 2.1-2.4).
TOLERANCES: dict[str, dict[str, float]] = {
    "appearance_feature_extractor": {"f_s": 1e-4},
    "motion_extractor": {k: 1e-4 for k in ("pitch", "yaw", "roll", "t", "exp", "scale", "kp")},
    "warping_network": {"out": 1e-4, "dense.deformation": 1e-4, "dense.occlusion_map": 1e-4, "dense.mask": 1e-4},
    "spade_decoder": {"image": 1e-3, "logits": 1e-4, "render_hwc255": 1e-3},
}


def _seeded(module: torch.nn.Module, meta: dict) -> torch.nn.Module:
    return fill_seeded_(module, salt=int(meta["weight_salt"])).eval()


def _compare_all(kind: str, tensors: dict, ours: dict[str, torch.Tensor]) -> None:
    """Every out.* of the case must be produced by us and be within its tolerance."""
    refs = {k[len("out."):]: v for k, v in tensors.items() if k.startswith("out.")}
    assert refs, f"{kind}: case has no out.* tensors"
    tols = TOLERANCES[kind]
    unknown = sorted(set(refs) - set(tols))
    assert not unknown, f"{kind}: no tolerance known for outputs {unknown}"
    missing = sorted(set(refs) - set(ours))
    assert not missing, f"{kind}: our module does not produce {missing}"
    for name, ref in refs.items():
        assert ours[name].dtype == ref.dtype, f"{kind}.{name}: dtype {ours[name].dtype} != {ref.dtype}"
        assert_close(f"{kind}.{name}", ours[name], ref, tols[name])


@torch.no_grad()
def check_appearance_feature_extractor(tensors: dict, meta: dict) -> None:
    from newsstudio.engines.ditto.models import AppearanceFeatureExtractor

    m = _seeded(AppearanceFeatureExtractor(), meta)
    _compare_all("appearance_feature_extractor", tensors, {"f_s": m(tensors["in.image"])})


@torch.no_grad()
def check_motion_extractor(tensors: dict, meta: dict) -> None:
    from newsstudio.engines.ditto.models import MotionExtractor
    from newsstudio.engines.ditto.models.motion_extractor import MOTION_OUTPUT_NAMES

    m = _seeded(MotionExtractor(), meta)
    outs = m(tensors["in.image"])
    order = meta.get("output_tuple_order", list(MOTION_OUTPUT_NAMES))
    assert list(order) == list(MOTION_OUTPUT_NAMES), f"tuple order {order} != {MOTION_OUTPUT_NAMES}"
    _compare_all("motion_extractor", tensors, dict(zip(MOTION_OUTPUT_NAMES, outs)))


@torch.no_grad()
def check_warping_network(tensors: dict, meta: dict) -> None:
    from newsstudio.engines.ditto.models import WarpingNetwork

    m = _seeded(WarpingNetwork(), meta)
    out, dense = m.forward_debug(tensors["in.feature_3d"], tensors["in.kp_source"], tensors["in.kp_driving"])
    ours = {"out": out, **{f"dense.{k}": v for k, v in dense.items()}}
    _compare_all("warping_network", tensors, ours)


@torch.no_grad()
def check_spade_decoder(tensors: dict, meta: dict) -> None:
    from newsstudio.engines.ditto.models import SPADEDecoder
    from newsstudio.engines.ditto.models.spade_decoder import render_hwc255

    m = _seeded(SPADEDecoder(), meta)
    captured: dict[str, torch.Tensor] = {}
    # Like the reference: the logits are the conv_img stage's output, seen by a forward hook.
    hook = m.conv_img.register_forward_hook(lambda _m, _i, o: captured.__setitem__("logits", o))
    try:
        image = m(tensors["in.feature"])
    finally:
        hook.remove()
    ours = {"image": image, "logits": captured["logits"], "render_hwc255": render_hwc255(image)}
    _compare_all("spade_decoder", tensors, ours)

    # The folded (inference) form must give the same result as the spectral-normed one.
    m.fold_spectral_norm_()
    assert m.spectral_norm_folded
    assert_close("spade_decoder.logits(folded)", m.forward_logits(tensors["in.feature"]), tensors["out.logits"],
                 TOLERANCES["spade_decoder"]["logits"])


CHECKS = {
    "appearance_feature_extractor": check_appearance_feature_extractor,
    "motion_extractor": check_motion_extractor,
    "warping_network": check_warping_network,
    "spade_decoder": check_spade_decoder,
}
