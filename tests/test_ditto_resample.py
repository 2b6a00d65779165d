"""Ditto at output rates other than 25 fps: its motion rows resampled (engines/ditto/resample.py)."""
from __future__ import annotations

import math

import pytest
import torch

from newsstudio.engines.base import TensorFrameQueue
from newsstudio.engines.ditto.motion_stitch import (
    MOTION_LAYOUT,
    bin66_to_degree,
    motion_rows_to_info,
)
from newsstudio.engines.ditto.resample import MotionResampler, interpolate_driving_rows

D = 265  # motion row width; driving rows are [motion D | d0 D | blink index]


def _rows(n: int, seed: int = 0, idle: tuple[int, ...] = ()) -> torch.Tensor:
    """Driving rows whose linear columns move with time and whose angle logits are random."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(n, 2 * D + 1, generator=g, dtype=torch.float64) * 2
    rows[:, D : 2 * D] = rows[:1, D : 2 * D]  # one reference row d0 per stream
    rows[:, 2 * D] = torch.arange(n, dtype=torch.float64) % 7  # blink schedule index
    rows[list(idle), 2 * D] = -1
    return rows


def _angles(rows: torch.Tensor) -> torch.Tensor:
    info = motion_rows_to_info(rows[:, :D])
    return torch.stack([bin66_to_degree(info[k]) for k in ("pitch", "yaw", "roll")], 1)


def _linear_columns() -> list[int]:
    cols, s = [], 0
    for key, n in MOTION_LAYOUT[:-1]:  # the motion row has no kp block
        if key not in ("pitch", "yaw", "roll"):
            cols += list(range(s, s + n))
        s += n
    return cols


def test_interpolated_rows_turn_the_head_linearly_and_keep_blink_and_rest_whole():
    a, b = _rows(4, seed=1), _rows(4, seed=2)
    b[:, D:] = a[:, D:]  # same stream
    b[:, 2 * D] = a[:, 2 * D] + 1
    w = torch.tensor([0.0, 0.25, 0.5, 0.9], dtype=torch.float64)
    out = interpolate_driving_rows(a, b, w, D)
    # the angles the stitcher reads back are the linear mix of the two rows' angles
    torch.testing.assert_close(_angles(out), torch.lerp(_angles(a), _angles(b), w[:, None]), rtol=0, atol=1e-9)
    lin = _linear_columns()
    torch.testing.assert_close(out[:, lin], torch.lerp(a[:, lin], b[:, lin], w[:, None]))
    assert torch.equal(out[0], a[0])  # on a source row: that row, bit for bit
    assert out[:, 2 * D].tolist() == [a[0, 2 * D], a[1, 2 * D], b[2, 2 * D], b[3, 2 * D]]  # nearer row's blink
    torch.testing.assert_close(_angles(torch.cat([out[:, D:2 * D], out[:, :1]], 1)), _angles(a[:, D:]))  # d0 kept
    # a rest row on either side: the nearer row, whole (speech and rest never blend)
    a[1, 2 * D] = a[3, 2 * D] = -1
    out = interpolate_driving_rows(a, b, w, D)
    assert torch.equal(out[1], a[1]) and torch.equal(out[3], b[3])  # w 0.25 -> a, w 0.9 -> b
    with pytest.raises(ValueError, match="rows must be"):
        interpolate_driving_rows(a[:, :-1], b[:, :-1], w, D)


def _resampled(rows: torch.Tensor, fps: float, pieces: list[int], take_every: bool = True) -> torch.Tensor:
    inner = TensorFrameQueue()
    rs = MotionResampler(inner, 25, fps, D)
    out, s = [], 0
    for n in pieces:
        rs.push(rows[s : s + n])
        s += n
        if take_every and rs.ready:
            out.append(rs.take(rs.ready))
    rs.close()
    if rs.ready:
        out.append(rs.take(rs.ready))
    return torch.cat(out)


@pytest.mark.parametrize("fps", [30, 50, 29.97, 12.5])
def test_resampled_motion_follows_source_time_whatever_the_pieces(fps):
    rows = _rows(37, seed=3)
    once = _resampled(rows, fps, [37], take_every=False)
    assert once.shape[0] == math.ceil(37 * fps / 25)  # the last row holds to the end of the audio
    pieces = _resampled(rows, fps, [1, 5, 2, 11, 3, 15])  # rows handed over as the LMDM releases them
    assert torch.equal(once, pieces)
    # frame k shows source time k * 25 / fps: its linear columns are the rows' lerp there
    lin = _linear_columns()
    step = 25 / fps
    for k in range(once.shape[0]):
        s = min(k * step, 36.0)
        i = min(math.floor(s + 1e-9), 36)
        j, w = min(i + 1, 36), s - i
        torch.testing.assert_close(once[k, lin], torch.lerp(rows[i, lin], rows[j, lin], w), rtol=1e-7, atol=1e-7)


def test_a_resampled_frame_waits_only_for_the_row_after_its_own():
    rows = _rows(10, seed=4)
    rs = MotionResampler(TensorFrameQueue(), 25, 30, D)
    rs.push(rows[:3])  # source rows 0..2: frames at s = 0, 5/6, 5/3 are ready; s = 5/2 needs row 3
    assert rs.ready == 3
    rs.take(2)
    assert rs.ready == 1
    rs.push(rows[3:4])  # now s = 5/2 too; s = 10/3 needs row 4
    assert rs.ready == 2
    with pytest.raises(ValueError, match="ready"):
        rs.take(3)


def test_resampling_out_of_range_rates_is_refused():
    with pytest.raises(ValueError, match="fps"):
        MotionResampler(TensorFrameQueue(), 25, 0, D)
    with pytest.raises(ValueError, match="fps"):
        MotionResampler(TensorFrameQueue(), 25, float("nan"), D)
    with pytest.raises(ValueError, match="fps"):
        MotionResampler(TensorFrameQueue(), 25, 1000, D)
