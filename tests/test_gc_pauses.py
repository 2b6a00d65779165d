"""The server's garbage-collector timing and the freeze after warm-up (server/gc_pauses.py)."""
from __future__ import annotations

import gc

from newsstudio.server.gc_pauses import GcPauses, freeze_warm_objects, unfreeze


def test_every_collection_is_counted_and_timed_and_long_ones_listed_in_order():
    pauses = GcPauses(long_ms=0.0)  # every run counts as long here
    pauses.install().install()  # idempotent: one callback
    try:
        gc.collect(0)
        gc.collect()
        snap = pauses.snapshot()
        assert snap["collections"][0] >= 1 and snap["collections"][2] >= 1
        assert snap["pause_ms_total"][2] > 0
        numbers = [p[0] for p in snap["long_pauses"]]
        assert numbers == sorted(numbers) and len(numbers) == sum(snap["collections"])
        assert snap["long_pauses"][-1][2] == 2  # the last run was the full collection
    finally:
        gc.callbacks.remove(pauses._on_gc)
    assert pauses._on_gc not in gc.callbacks


def test_freezing_takes_the_objects_alive_out_of_later_collections():
    """The objects alive at the freeze leave the generations a collection walks (the oldest one
    included); objects made afterwards are collected as usual; unfreezing puts them back."""
    keep = [[i] for i in range(1000)]  # long-lived containers, as a warm engine's

    def walked(obj) -> bool:
        return any(o is obj for g in range(3) for o in gc.get_objects(generation=g))

    gc.collect()
    assert walked(keep)
    try:
        frozen = freeze_warm_objects()
        assert frozen >= len(keep) and gc.get_freeze_count() == frozen
        assert not walked(keep) and not walked(keep[0])
        cycle: list = []
        cycle.append(cycle)  # garbage made after the freeze: found and freed
        del cycle
        assert gc.collect() >= 1
    finally:
        unfreeze()
    assert gc.get_freeze_count() == 0 and walked(keep)
