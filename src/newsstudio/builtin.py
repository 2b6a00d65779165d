"""Built-in demo media, so the main job works on a stranger's machine with nothing downloaded.

`builtin:astronaut` is scikit-image's public-domain portrait (NASA); `builtin:hello` is a
speech clip the project generated with espeak-ng and ships in `newsstudio/assets`.
"""
from __future__ import annotations

import os
from pathlib import Path

PREFIX = "builtin:"
ASSETS = Path(__file__).resolve().parent / "assets"
AUDIO = {"hello": ASSETS / "hello.flac"}
IMAGES = ("astronaut",)


def is_builtin(ref: object) -> bool:
    return isinstance(ref, str) and ref.startswith(PREFIX)


def builtin_audio(ref: str) -> Path:
    name = ref[len(PREFIX) :]
    if name not in AUDIO:
        raise ValueError(f"unknown built-in audio {ref!r}; have: {', '.join(PREFIX + k for k in AUDIO)}")
    return AUDIO[name]


def builtin_image(ref: str, cache_dir: str | os.PathLike[str]) -> Path:
    """Write the built-in image to `cache_dir` once and return its path."""
    name = ref[len(PREFIX) :]
    if name not in IMAGES:
        raise ValueError(f"unknown built-in avatar {ref!r}; have: {', '.join(PREFIX + k for k in IMAGES)}")
    path = Path(cache_dir) / f"{name}.png"
    if not path.is_file():
        from PIL import Image
        from skimage import data

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.png")
        Image.fromarray(getattr(data, name)()).save(tmp)
        os.replace(tmp, path)
    return path
