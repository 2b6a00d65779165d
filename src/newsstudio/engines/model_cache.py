"""Networks built once per process per settings key, shared by every engine made with those settings.

The CLI, the server and the tests create several engines; the MuseTalk UNet alone is 850M
parameters. Anything that changes the tensors (dtype, device, memory layout) must be part of the
key: a CUDA graph captured by one engine reads its weights at fixed addresses, so the shared
weights are never converted in place after they are handed out.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class ModelCache(Generic[T]):
    """A small LRU of built models (evicted entries stay alive while an engine holds them)."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._items: OrderedDict[Hashable, T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        with self._lock:
            m = self._items.get(key)
            if m is not None:
                self._items.move_to_end(key)
                return m
            m = build()
            self._items[key] = m
            while len(self._items) > self.size:
                self._items.popitem(last=False)
            return m
