"""The bodies of recently written or read messages, in memory, so reading a live run's history skips DuckDB.

Messages are content-addressed, so an entry can never go stale: a digest names one body forever.
Reading a snapshot otherwise joins its references against the whole messages table, a scan that
grows with the store; the runs people continue or fork are mostly the ones just written.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

DEFAULT_CACHE_BYTES = 128 << 20


class MessageCache:
    """A least-recently-used map from digest to stored body, bounded by the bodies' total size."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._bodies: OrderedDict[bytes, str] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # ingest adds while query threads read

    def put(self, digest: bytes, body: str) -> None:
        size = len(body)
        if size > self.max_bytes // 8:  # one huge message must not flush everything else
            return
        with self._lock:
            if digest in self._bodies:
                self._bodies.move_to_end(digest)
                return
            self._bodies[digest] = body
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._bodies.popitem(last=False)
                self._bytes -= len(evicted)

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
