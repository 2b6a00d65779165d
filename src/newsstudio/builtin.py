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


#: The built-in portrait's face box (x0, y0, x1, y1) in its 512 x 512 pixels, by eye.
ASTRONAUT_FACE = (150, 25, 300, 190)


def builtin_face_crop(size: int, scale: float = 1.2):
    """The built-in portrait's face as a network sees one: a square ``scale`` times the face box's
    larger side around its centre (shifted to stay inside the image), area-resized to ``size`` x
    ``size``, uint8 RGB. Sample input for calibrating a network when no avatar is at hand."""
    import numpy as np
    from PIL import Image
    from skimage import data

    image = data.astronaut()
    x0, y0, x1, y1 = ASTRONAUT_FACE
    side = min(int(round(max(x1 - x0, y1 - y0) * scale)), *image.shape[:2])
    left = min(max(0, (x0 + x1 - side) // 2), image.shape[1] - side)
    top = min(max(0, (y0 + y1 - side) // 2), image.shape[0] - side)
    crop = Image.fromarray(image[top:top + side, left:left + side]).resize((size, size), Image.Resampling.BOX)
    return np.asarray(crop)
