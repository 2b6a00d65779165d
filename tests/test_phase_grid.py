"""Phase slots (newsstudio.server.phases): where a new live session's media clock starts."""
from __future__ import annotations

import math
from fractions import Fraction

import pytest

from newsstudio.live import ScaledTime
from newsstudio.server.phases import PhaseGrid


def test_sessions_spread_over_slots_and_start_on_their_slots_phase():
    ts = ScaledTime()
    ts.set(1000.123)
    grid = PhaseGrid(3, ts)
    period = 8 / 30
    taken = []
    for i in range(7):
        ts.set(1000.123 + 0.071 * i)  # sessions open at arbitrary moments
        now = ts()
        slot = grid.take("musetalk", Fraction(30), 8)
        assert now - period < slot.origin <= now  # media time at opening is in [0, period): no added wait
        phase = (slot.origin / period) % 1.0
        assert math.isclose(phase, slot.index / 3, abs_tol=1e-6) or math.isclose(phase, 1.0, abs_tol=1e-6) and slot.index == 0
        taken.append(slot)
    assert sorted(s.index for s in taken) == [0, 0, 0, 1, 1, 2, 2]  # balanced: the least-held slot first
    assert grid.held() == {"musetalk@30fps/8": [3, 2, 2]}
    grid.give_back(taken[1])  # a session of slot 1 closes: the next one takes its slot
    assert grid.take("musetalk", Fraction(30), 8).index == taken[1].index
    # other engines, rates and request sizes have slots of their own
    assert grid.take("ditto", Fraction(30), 8).index == 0
    assert grid.take("musetalk", Fraction(25), 8).index == 0
    with pytest.raises(ValueError, match="at least one slot"):
        PhaseGrid(0)
