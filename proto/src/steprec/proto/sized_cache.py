"""A least-recently-used map bounded by the total size of its values, for values that never change.

The recorder keeps message bodies (content-addressed: a digest names one body forever) and rebuilt
snapshot reference lists in one; `RecorderClient` keeps validated messages by digest in another.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class SizedCache(Generic[K, V]):
    """Bounded by the memory it holds: each key as `sys.getsizeof` counts it, each value as `size` does
    (`sys.getsizeof` unless given), and the map's own table. Thread-safe.

    Counting characters instead let the recorder's message cache hold 1.4 times its bound in the soak
    (about 200 bytes of objects around each 600-character body) and up to 4 times it for text outside
    Latin-1, which CPython stores at 2 or 4 bytes a character.
    """

    def __init__(self, max_bytes: int, size: Callable[[V], int] = sys.getsizeof) -> None:
        self.max_bytes = max_bytes
        self._size = size
        self._values: OrderedDict[K, V] = OrderedDict()
        self._entry_bytes = 0
        self._lock = threading.Lock()  # e.g. the recorder's ingest adds while query threads read

    def _entry_size(self, key: K, value: V) -> int:
        return sys.getsizeof(key) + self._size(value)

    def put(self, key: K, value: V) -> None:
        size = self._entry_size(key, value)
        if size > self.max_bytes // 8:  # one huge value must not flush everything else
            return
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return
            self._values[key] = value
            self._entry_bytes += size
            while self._entry_bytes + sys.getsizeof(self._values) > self.max_bytes and self._values:
                evicted = self._values.popitem(last=False)
                self._entry_bytes -= self._entry_size(*evicted)

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

    @property
    def entries(self) -> int:
        return len(self._values)

    @property
    def bytes(self) -> int:
        """What the cache holds: its keys, its values and the map itself."""
        with self._lock:
            return self._entry_bytes + sys.getsizeof(self._values)
