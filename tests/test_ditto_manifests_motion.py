"""Ditto motion networks against the official manifests: every state_dict key (in order), shape
and dtype, the parameter/element counts, and the official checkpoint wrappings load strictly."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from golden.golden_io import GOLDEN_DIR
from newsstudio.engines.ditto.models.lmdm import LMDM
from newsstudio.engines.ditto.models.motion_decoder import MotionDecoder
from newsstudio.engines.ditto.models.stitching_network import StitchingNetwork, stitching_state_dict_from_checkpoint
from newsstudio.weights.seeded import fill_seeded_


def _manifest(name: str) -> dict:
    p = GOLDEN_DIR / "ditto" / f"manifest_{name}.json"
    if not p.exists():
        pytest.skip(f"{p} is absent (set NEWSSTUDIO_GOLDEN_DIR)")
    return json.loads(p.read_text())


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _check_against(module: torch.nn.Module, man: dict) -> None:
    sd = module.state_dict()
    want = man["state_dict"]
    assert list(sd) == list(want), "state_dict keys differ (or their order)"
    for k, spec in want.items():
        assert list(sd[k].shape) == spec["shape"], f"{k}: {list(sd[k].shape)} != {spec['shape']}"
        assert sd[k].dtype == _dtype(spec["dtype"]), f"{k}: {sd[k].dtype} != {spec['dtype']}"
    assert len(sd) == man["num_state_dict_entries"]
    assert sum(v.numel() for v in sd.values()) == man["num_state_dict_elements"]
    assert sum(p.numel() for p in module.parameters()) == man["num_parameters"]


def _random_state(man_sd: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {prefix + k: torch.randn(v["shape"], generator=g).to(_dtype(v["dtype"])) for k, v in man_sd.items()}


@pytest.fixture(scope="module")
def lmdm() -> LMDM:
    man = _manifest("MotionDecoder")
    return LMDM(**man["constructor_kwargs"]["LMDM"])


def test_motion_decoder_manifest(lmdm: LMDM) -> None:
    man = _manifest("MotionDecoder")
    assert isinstance(lmdm.model, MotionDecoder)
    _check_against(lmdm.model, man)
    # the LMDM wrapper's own schedule buffers are not part of the checkpoint
    for k, spec in man["lmdm_wrapper_buffers_not_in_checkpoint"].items():
        b = getattr(lmdm, k)
        assert list(b.shape) == spec["shape"] and b.dtype == _dtype(spec["dtype"])


def test_motion_decoder_rotary_freqs_shared_and_kept(lmdm: LMDM) -> None:
    man = _manifest("MotionDecoder")
    dim = lmdm.model.latent_dim
    expected = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    fill_seeded_(lmdm.model, 0)
    sd = lmdm.model.state_dict()
    names = [k for k in sd if k.endswith("rotary.freqs")]
    assert sorted(names) == sorted(man["non_learned_entries"])
    for k in names:
        assert torch.equal(sd[k], expected), k
    # one shared module, not copies
    assert all(layer.rotary is lmdm.model.rotary for layer in lmdm.model.seqTransDecoder.stack)
    assert all(layer.rotary is lmdm.model.rotary for layer in lmdm.model.cond_encoder)


def test_lmdm_checkpoint_loads_strictly(lmdm: LMDM, tmp_path: Path) -> None:
    man = _manifest("MotionDecoder")
    sd = _random_state(man["state_dict"])
    # the 11 rotary copies are one shared buffer: in a real checkpoint they hold equal values
    freqs = sd["rotary.freqs"]
    sd = {k: (freqs if k.endswith("rotary.freqs") else v) for k, v in sd.items()}
    path = tmp_path / "lmdm.pth"
    torch.save({"model_state_dict": sd, "epoch": 7}, path)
    lmdm.load_checkpoint(path)
    got = lmdm.model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in sd.items())
    assert not lmdm.training
    # a missing key is refused
    bad = dict(sd)
    bad.pop("final_layer.bias")
    with pytest.raises(RuntimeError):
        lmdm.load_model_state_dict({"model_state_dict": bad})


def test_stitching_network_manifest() -> None:
    man = _manifest("StitchingNetwork")
    _check_against(StitchingNetwork(**man["constructor_kwargs"]), man)


def test_stitching_checkpoint_wrapping(tmp_path: Path) -> None:
    man = _manifest("StitchingNetwork")
    inner = _random_state(man["checkpoint_keys_under_retarget_shoulder"])
    assert all(k.startswith("module.") for k in inner)
    other = {"module.mlp.0.weight": torch.zeros(3, 3)}  # other entries are ignored
    path = tmp_path / "stitch_network.pth"
    torch.save({"retarget_shoulder": inner, "retarget_mouth": other, "retarget_eye": other}, path)
    net = StitchingNetwork().load_checkpoint(path)
    got = net.state_dict()
    for k, v in inner.items():
        assert torch.equal(got[k.replace("module.", "")], v)
    assert not net.training
    # every occurrence of "module." is removed, not only a leading prefix
    sd = stitching_state_dict_from_checkpoint({"retarget_shoulder": {"module.a.module.b": torch.zeros(1)}})
    assert list(sd) == ["a.b"]
    # strict: an unexpected key is refused
    inner_bad = dict(inner, **{"module.mlp.8.weight": torch.zeros(1)})
    with pytest.raises(RuntimeError):
        StitchingNetwork().load_state_dict(stitching_state_dict_from_checkpoint({"retarget_shoulder": inner_bad}))
    with pytest.raises(KeyError):
        stitching_state_dict_from_checkpoint({"retarget_mouth": inner})
