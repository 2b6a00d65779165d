"""Which avatar frame each output frame uses, and how output frames are batched.

MuseTalk prepares an avatar as a ping-pong cycle (frames 0..N-1 then N-1..0, both ends twice
in a row) so that a short loop can be played for any audio length without a jump. Output frame
``i`` uses audio prompt ``i`` and cycle position ``i mod 2N`` for everything that comes from the
avatar (latent, original frame, box, blend mask, mask crop box).

The reference realtime script stops blending one frame early (its blending thread exits when
its counter reaches ``len - 1``); this module implements the intended mapping, where every
generated frame is used.
"""
from __future__ import annotations

import numpy as np


def ping_pong_cycle(n_frames: int) -> np.ndarray:
    """Source frame index of each cycle position: ``0..N-1, N-1..0`` (length ``2N``)."""
    if n_frames <= 0:
        raise ValueError(f"an avatar needs at least one frame, got {n_frames}")
    fwd = np.arange(n_frames, dtype=np.int64)
    return np.concatenate([fwd, fwd[::-1]])


def cycle_positions(n_output: int, cycle_len: int, delay: int = 0) -> np.ndarray:
    """Cycle position of each output frame: ``(i + delay) mod cycle_len``.

    With ``delay = 0`` this is the intended mapping for every avatar-derived input; a non-zero
    delay is what the reference ``datagen(delay_frame=...)`` applies to the latents only.
    """
    if cycle_len <= 0:
        raise ValueError(f"cycle length must be positive, got {cycle_len}")
    if n_output < 0:
        raise ValueError(f"negative number of output frames: {n_output}")
    return (np.arange(n_output, dtype=np.int64) + int(delay)) % int(cycle_len)


def output_source_frames(n_output: int, n_avatar_frames: int, delay: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(cycle position, source avatar frame) for every output frame of a ping-pong avatar."""
    cycle = ping_pong_cycle(n_avatar_frames)
    pos = cycle_positions(n_output, len(cycle), delay)
    return pos, cycle[pos]


def batch_sizes(n_items: int, batch_size: int) -> list[int]:
    """Sizes of the batches ``datagen`` yields: full batches, then one final partial batch."""
    if batch_size <= 0:
        raise ValueError(f"batch size must be positive, got {batch_size}")
    full, rest = divmod(int(n_items), int(batch_size))
    return [int(batch_size)] * full + ([rest] if rest else [])


def batch_slices(n_items: int, batch_size: int) -> list[slice]:
    """The same batches as index ranges into the output frame sequence."""
    out, start = [], 0
    for size in batch_sizes(n_items, batch_size):
        out.append(slice(start, start + size))
        start += size
    return out
