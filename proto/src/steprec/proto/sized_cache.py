"""A least-recently-used map bounded by the total size of its values, for values that never change.

The recorder keeps message bodies (content-addressed: a digest names one body forever) and rebuilt
snapshot reference lists in one; `RecorderClient` keeps validated messages by digest in another.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class SizedCache(Generic[K, V]):
    """Bounded by the total `size()` of its values (their `len()` unless given); thread-safe."""

    def __init__(self, max_bytes: int, size: Callable[[V], int] = len) -> None:  # type: ignore[assignment]
        self.max_bytes = max_bytes
        self._size = size
        self._values: OrderedDict[K, V] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # e.g. the recorder's ingest adds while query threads read

    def put(self, key: K, value: V) -> None:
        size = self._size(value)
        if size > self.max_bytes // 8:  # one huge value must not flush everything else
            return
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return
            self._values[key] = value
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._values.popitem(last=False)
                self._bytes -= self._size(evicted)

    def get(self, key: K) -> V | None:
        """The cached value of `key`, marked as just used, or None."""
        return self.get_many((key,)).get(key)

    def get_many(self, keys: Iterable[K]) -> dict[K, V]:
        """The cached values among `keys`, each marked as just used."""
        found = {}
        with self._lock:
            for key in keys:
                value = self._values.get(key)
                if value is not None:
                    self._values.move_to_end(key)
                    found[key] = value
        return found
