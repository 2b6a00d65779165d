"""Our Ditto image networks have exactly the official state_dict (manifests from the golden set),
and a checkpoint written like the official .pth files loads strictly through checkpoints.py."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from newsstudio.engines.ditto.checkpoints import DittoCheckpointError, load_ditto_module, registered_modules
from newsstudio.engines.ditto.models import AppearanceFeatureExtractor, MotionExtractor, SPADEDecoder, WarpingNetwork
from newsstudio.weights.seeded import fill_seeded_

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_DITTO = Path(os.environ.get("NEWSSTUDIO_GOLDEN_DIR", ROOT.parent / "shared" / "golden")) / "ditto"

CLASSES = {c.__name__: c for c in (AppearanceFeatureExtractor, MotionExtractor, WarpingNetwork, SPADEDecoder)}


def _manifest(name: str) -> dict:
    path = GOLDEN_DITTO / f"manifest_{name}.json"
    if not path.is_file():
        pytest.skip(f"golden manifest {path} is absent (set NEWSSTUDIO_GOLDEN_DIR)")
    return json.loads(path.read_text())


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


@pytest.mark.parametrize("name", list(CLASSES))
def test_state_dict_equals_manifest(name: str) -> None:
    man = _manifest(name)
    assert man.get("module_class", name) == name
    assert not man.get("constructor_kwargs"), "manifest expects non-default constructor arguments"
    module = CLASSES[name]()
    sd = module.state_dict()
    expected = man["state_dict"]
    assert list(sd) == list(expected), "state_dict keys or their order differ from the manifest"
    for key, spec in expected.items():
        assert list(sd[key].shape) == spec["shape"], f"{key}: shape {list(sd[key].shape)} != {spec['shape']}"
        assert _dtype_name(sd[key]) == spec["dtype"], f"{key}: dtype {sd[key].dtype} != {spec['dtype']}"
    n_params = sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
    assert n_params == man["num_parameters"]
    assert len(sd) == man["num_state_dict_entries"]
    assert sum(t.numel() for t in sd.values()) == man["num_state_dict_elements"]
    # The checkpoint named by the manifest is the one checkpoints.py loads for this class.
    assert Path(man["checkpoint_file"]).name == registered_modules()[name].filename


@pytest.mark.parametrize("name", list(CLASSES))
def test_checkpoint_round_trip(name: str, tmp_path: Path) -> None:
    """Seeded weights saved as a plain state_dict under the official file name load back strictly
    (by folder, by file, by class), bit-exact."""
    cls = CLASSES[name]
    src = fill_seeded_(cls(), salt=3)
    filename = registered_modules()[name].filename
    folder = tmp_path / "ditto_pytorch" / "models"
    folder.mkdir(parents=True)
    torch.save(src.state_dict(), folder / filename)

    ref = src.state_dict()
    for how in (name, filename.removesuffix(".pth"), cls):
        loaded = load_ditto_module(how, tmp_path if how is name else folder / filename)
        assert isinstance(loaded, cls) and not loaded.training
        got = loaded.state_dict()
        assert list(got) == list(ref)
        assert all(torch.equal(got[k], ref[k]) for k in ref), f"{name}: values changed in the round trip"


def test_wrong_checkpoint_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "decoder.pth"
    torch.save(AppearanceFeatureExtractor().state_dict(), bad)
    with pytest.raises(DittoCheckpointError, match="decoder.pth") as err:
        load_ditto_module("SPADEDecoder", bad)
    assert "missing keys" in str(err.value) and "unexpected keys" in str(err.value)

    sd = AppearanceFeatureExtractor().state_dict()
    sd["second.weight"] = torch.zeros(8, 256, 1, 1)
    torch.save(sd, tmp_path / "appearance_extractor.pth")
    with pytest.raises(DittoCheckpointError, match=r"appearance_extractor\.pth.*second\.weight"):
        load_ditto_module("AppearanceFeatureExtractor", tmp_path)

    (tmp_path / "motion_extractor.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(DittoCheckpointError, match="motion_extractor.pth"):
        load_ditto_module(MotionExtractor, tmp_path)
    with pytest.raises(FileNotFoundError, match="warp_network.pth"):
        load_ditto_module("warp_network", tmp_path)


def test_load_casts_dtype_but_keeps_integer_buffers(tmp_path: Path) -> None:
    torch.save(fill_seeded_(AppearanceFeatureExtractor(), salt=0).state_dict(), tmp_path / "appearance_extractor.pth")
    m = load_ditto_module("appearance_extractor", tmp_path, dtype=torch.float64)
    sd = m.state_dict()
    assert sd["second.weight"].dtype == torch.float64
    assert sd["first.norm.num_batches_tracked"].dtype == torch.int64
