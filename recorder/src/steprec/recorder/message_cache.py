"""The bodies of recently written or read messages, in memory, so reading a live run's history skips DuckDB.

Messages are content-addressed, so an entry can never go stale: a digest names one body forever.
Reading a snapshot otherwise joins its references against the whole messages table, a scan that
grows with the store; the runs people continue or fork are mostly the ones just written.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict

DEFAULT_CACHE_BYTES = 128 << 20


class MessageCache:
    """A least-recently-used map from digest to stored body, bounded by the memory it holds.

    The bound counts what the process holds, as `sys.getsizeof` tells it: each body and digest
    object and the map's own table and links. Counting characters instead let the cache hold
    1.4 times its bound in the soak (about 200 bytes of objects around each 600-character body)
    and up to 4 times it for text outside Latin-1, which CPython stores at 2 or 4 bytes a character.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._bodies: OrderedDict[bytes, str] = OrderedDict()
        self._entry_bytes = 0
        self._lock = threading.Lock()  # ingest adds while query threads read

    def put(self, digest: bytes, body: str) -> None:
        size = sys.getsizeof(body) + sys.getsizeof(digest)
        if size > self.max_bytes // 8:  # one huge message must not flush everything else
            return
        with self._lock:
            if digest in self._bodies:
                self._bodies.move_to_end(digest)
                return
            self._bodies[digest] = body
            self._entry_bytes += size
            while self._entry_bytes + sys.getsizeof(self._bodies) > self.max_bytes and self._bodies:
                evicted_digest, evicted = self._bodies.popitem(last=False)
                self._entry_bytes -= sys.getsizeof(evicted) + sys.getsizeof(evicted_digest)

    def get_many(self, digests: set[bytes]) -> dict[bytes, str]:
        """The cached bodies among `digests`, each marked as just used."""
        found = {}
        with self._lock:
            for digest in digests:
                body = self._bodies.get(digest)
                if body is not None:
                    self._bodies.move_to_end(digest)
                    found[digest] = body
        return found

    @property
    def entries(self) -> int:
        return len(self._bodies)

    @property
    def bytes(self) -> int:
        """What the cache holds: its bodies, their digests and the map itself."""
        with self._lock:
            return self._entry_bytes + sys.getsizeof(self._bodies)
