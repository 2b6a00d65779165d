"""Shared fixtures: where the real media and the golden vectors live."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MEDIA_DIR = Path(os.environ.get("NEWSSTUDIO_MEDIA_DIR", SHARED / "media"))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def media_path(name: str) -> Path:
    """Path of a file in ../shared/media; skips the test with a reason when it is absent."""
    p = MEDIA_DIR / name
    if not p.exists():
        pytest.skip(f"real test media {p} is absent (tests read ../shared/media; none is committed)")
    return p


@pytest.fixture
def media():
    return media_path


@pytest.fixture(scope="session")
def astronaut_packet(tmp_path_factory):
    """A small avatar (256x256) prebaked once per test session from scikit-image's astronaut."""
    from PIL import Image
    from skimage import data

    from newsstudio.avatar.prebake import prebake

    root = tmp_path_factory.mktemp("avatars")
    src = root / "astronaut.png"
    Image.fromarray(data.astronaut()).resize((256, 256)).save(src)
    return prebake(src, "astronaut", root=root, progress=False)
