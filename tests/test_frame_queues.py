"""The per-stream stage queues (engines/base.py): FIFO order across pushes, an empty take before any
frame exists (what the stream runner asks of a stage that has nothing yet), clear errors."""
from __future__ import annotations

import pytest
import torch

from newsstudio.engines.base import QueuedStage, TensorFrameQueue


def test_frames_come_out_in_order_across_pushes_and_takes():
    q = TensorFrameQueue()
    q.push(torch.arange(6.0).reshape(3, 2))
    q.push(torch.zeros((0, 2)))  # an empty push changes nothing
    q.push(torch.arange(6.0, 10.0).reshape(2, 2))
    assert q.ready == 5
    assert q.take(2).tolist() == [[0, 1], [2, 3]]
    assert q.take(3).tolist() == [[4, 5], [6, 7], [8, 9]]
    assert q.ready == 0


def test_an_empty_take_before_any_frame_has_the_rows_width():
    q = TensorFrameQueue(7, "cpu")
    got = q.take(0)
    assert got.shape == (0, 7) and got.device.type == "cpu"
    with pytest.raises(ValueError, match="empty"):
        TensorFrameQueue().take(0)  # without a width there is no shape to give


def test_taking_more_than_ready_is_refused():
    q = TensorFrameQueue(2)
    q.push(torch.ones(1, 2))
    with pytest.raises(ValueError, match="asked for 2 frames, 1 ready"):
        q.take(2)
    assert q.ready == 1  # nothing lost


def test_a_queued_stage_hands_out_what_its_queue_holds():
    class Doubler(QueuedStage):
        def __init__(self) -> None:
            self.out = TensorFrameQueue(1)

        def push(self, value: torch.Tensor) -> None:
            self.out.push(2 * value)

        def close(self) -> None:
            self.out.close()

    s = Doubler()
    assert s.ready == 0 and s.take(0).shape == (0, 1)
    s.push(torch.tensor([[1.0], [2.0]]))
    assert s.ready == 2 and s.take(2).flatten().tolist() == [2.0, 4.0]
