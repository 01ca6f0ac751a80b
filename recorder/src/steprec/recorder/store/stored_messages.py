"""Which messages the store already holds: answered from memory for the common case, one query otherwise.

A continued run, a fork and every run of an agent that starts from the same instructions and prompt
carry messages the store holds already, so "is it stored?" is asked for most messages that arrive.
Asked one DuckDB join per snapshot it was two thirds of the recorder's time under real traffic
(py-spy, docs/benchmarks.md). The answer now comes from, in turn:

- the digests of messages logged but not applied yet (exact);
- a bounded memory of digests known to be in DuckDB: every message the applier committed and
  every one a lookup found, least recently used first out;
- a Bloom filter over every stored digest, so a message that is new (the other common case)
  needs no query;
- and for what is left, one join for all the messages of a request.

Prune deletes messages, so it empties the memory; a logged entry the applier sets aside never
reaches DuckDB, so its messages leave the pending set without entering the memory.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

import duckdb
import pyarrow as pa
from steprec.proto import wire

from .digests import DigestFilter

KNOWN_STORED_ENTRIES = 1 << 18
"""Digests remembered as stored: 262,144 of them, up to about 55 MiB (docs/storage.md)."""
_DIGEST_BYTES = sys.getsizeof(bytes(wire.DIGEST_SIZE))


class StoredMessages:
    """Answers "which of these messages does the store hold?" for ingest; fed by ingest and the applier."""

    def __init__(self, load_filter: Callable[[], DigestFilter], known_entries: int = KNOWN_STORED_ENTRIES) -> None:
        self._load_filter = load_filter
        self._filter = load_filter()
        self._lock = threading.Lock()
        self._pending: set[bytes] = set()
        self._known: OrderedDict[bytes, None] = OrderedDict()
        self._known_entries = known_entries

    def lookup(self, cursor: duckdb.DuckDBPyConnection, digests: set[bytes]) -> set[bytes]:
        """Which of `digests` are stored, in DuckDB or still in the log: memory first, then one join."""
        with self._lock:
            found = digests & self._pending
            for digest in digests - found:
                if digest in self._known:
                    self._known.move_to_end(digest)
                    found.add(digest)
        ask = [d for d in digests - found if self._filter.might_contain(d)]
        if not ask:
            return found
        cursor.register("wanted_digests", pa.table({"digest": pa.array(ask, pa.binary())}))
        try:
            rows = cursor.execute(
                "SELECT DISTINCT m.digest FROM messages m JOIN wanted_digests w ON m.digest = w.digest"
            ).fetchall()
        finally:
            cursor.unregister("wanted_digests")
        stored = {bytes(d) for (d,) in rows}
        self._remember(stored)
        return found | stored

    def staged(self, digest: bytes) -> None:
        """A new message is staged: the filter must say "maybe" for it from now on."""
        self._filter.add(digest)

    def logged(self, digests: Iterable[bytes]) -> None:
        """Staged messages are in the write-ahead log: stored, as far as ingest is concerned."""
        with self._lock:
            self._pending.update(digests)

    def applied(self, digests: Iterable[bytes]) -> None:
        """The applier committed these messages to DuckDB."""
        digests = list(digests)
        with self._lock:
            self._pending.difference_update(digests)
        self._remember(digests)

    def set_aside(self, digests: Iterable[bytes]) -> None:
        """The entry logging these messages will never be applied: they are not stored."""
        with self._lock:
            self._pending.difference_update(digests)

    def forget_applied(self) -> None:
        """Prune removed messages: what was known to be in DuckDB may not be any more."""
        with self._lock:
            self._known.clear()

    def reload_filter_if_full(self, wait_applied: Callable[[], None]) -> bool:
        """Rebuild the filter, bigger, once it is too full to answer "new" reliably; True if it was rebuilt."""
        if not self._filter.full:
            return False
        wait_applied()
        self._filter = self._load_filter()
        return True

    @property
    def nbytes(self) -> int:
        """The filter, the digests, and the memory's table and nodes as `sys.getsizeof` counts them.

        A fixed size per entry was 27% short at the bound: an `OrderedDict` churning there keeps
        rebuilding its table, at twice the size half of the time (the soak, docs/storage.md).
        """
        return self._filter.nbytes + sys.getsizeof(self._known) + len(self._known) * _DIGEST_BYTES

    def _remember(self, digests: Iterable[bytes]) -> None:
        with self._lock:
            for digest in digests:
                self._known[digest] = None
                self._known.move_to_end(digest)
            while len(self._known) > self._known_entries:
                self._known.popitem(last=False)
