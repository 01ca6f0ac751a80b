"""The applier: one thread that moves acknowledged log entries into the database, many per transaction.

Ingest appends an entry to the write-ahead log, hands it here and acknowledges; the applier lets
entries gather (`APPLY_LINGER_SECONDS`, cut short by a waiting reader) and writes them in one
transaction, one Arrow table per table, so commits stay few and large however many agents send.
Reads wait here until everything acknowledged before them is applied.

A full or unwritable disk stalls the applier: ingest is refused (`StoreUnavailable`, which the
exporters retry) and reads see what is applied, until a round succeeds again. An entry the
database refuses for good (it cannot happen with validated input, but a recorder must not wedge
on one) is set aside in `wal/set-aside/` and logged, and the applier goes on with the rest.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from ..daemon.metrics import Metrics
from .batch import Batch, entry_parts
from .duckdb_target import REFUSED_FOR_GOOD, DuckDBTarget
from .stored_messages import StoredMessages
from .wal import WriteAheadLog

logger = logging.getLogger(__name__)

APPLY_LINGER_SECONDS = 0.5
"""How long the applier lets acknowledged requests gather before a commit, unless a reader is waiting.

Fewer, larger commits keep DuckDB's commit cost (and its hold on the GIL) off
the ingest path; readers never wait for the linger, they cut it short.
"""
APPLY_BATCH_ENTRIES = 4096

Entry = tuple[int, bytes | Batch, set[bytes]]
"""A log entry: its sequence, its rows (staged, or as read back from the log), the messages it stores."""


class StoreUnavailable(Exception):
    """The store cannot take this write now (its disk is full or unwritable); the sender should retry."""


class Applier:
    """The applier thread, and what ingest and the reads wait on."""

    def __init__(
        self,
        target: DuckDBTarget,
        wal: WriteAheadLog,
        stored: StoredMessages,
        metrics: Metrics,
        on_snapshots_changed: Callable[[list[str]], None],
    ) -> None:
        self._target = target
        self._wal = wal
        self._stored = stored
        self._metrics = metrics
        self._on_snapshots_changed = on_snapshots_changed
        self._cond = threading.Condition()
        self._pending: list[Entry] = []
        self._closing = False
        self._readers_waiting = 0
        self.stalled: str | None = None
        """Why the applier cannot write the database now (a full disk), or None while it can."""
        self._set_aside_runs: set[str] = set()
        self.applied = target.applied_sequence()
        wal.skip_to(self.applied)
        self._recover()
        self._thread = threading.Thread(target=self._apply_forever, name="steprec-applier", daemon=True)
        self._thread.start()

    @property
    def pending_entries(self) -> int:
        return len(self._pending)

    def submit(self, sequence: int, batch: Batch, digests: set[bytes]) -> None:
        """A logged (and so acknowledged) entry, to be applied."""
        with self._cond:
            self._pending.append((sequence, batch, digests))
            self._cond.notify_all()

    def take_set_aside_runs(self) -> set[str]:
        """Runs of entries set aside since the last call: ingest's state of them is wrong."""
        with self._cond:
            runs, self._set_aside_runs = self._set_aside_runs, set()
        return runs

    def all_applied(self) -> bool:
        with self._cond:
            return self.applied >= self._wal.last_sequence

    def wait_applied(self, sequence: int, *, for_write: bool) -> None:
        """Wait until everything logged up to `sequence` is in the database.

        While the applier is stalled (a full disk) nothing waits for it: a write is refused
        with StoreUnavailable, a read goes on with what is applied.
        """
        with self._cond:
            if self.applied >= sequence:
                return
            self._readers_waiting += 1
            self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: self.applied >= sequence or self.stalled is not None)
            finally:
                self._readers_waiting -= 1
            if self.applied < sequence and for_write:
                raise StoreUnavailable(self.stalled)

    def close(self) -> None:
        """Apply everything acknowledged (unless the database cannot be written), then stop."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()

    def _recover(self) -> None:
        """Apply log entries a previous process acknowledged but did not apply, before serving."""
        entries = list(self._wal.entries_after(self.applied))
        for start in range(0, len(entries), 256):
            self._commit([(seq, payload, set()) for seq, payload in entries[start : start + 256]])
        if entries:
            logger.info("recovered %d acknowledged requests from the write-ahead log", len(entries))

    def _commit(self, entries: list[Entry]) -> None:
        """Apply `entries` in one transaction, or if the database refuses one of them for good, each alone.

        A refused entry is set aside and the others are applied. A passing failure (a full
        disk) raises, with every entry before the failing one applied and marked so.
        """
        try:
            changed = self._target.write([(seq, payload) for seq, payload, _ in entries])
        except REFUSED_FOR_GOOD as error:
            if len(entries) == 1:
                self._set_aside(entries[0], error)
            else:
                for entry in entries:
                    self._commit([entry])
            return
        if changed:  # before the entries count as applied: a read owed this commit must not see older answers
            self._on_snapshots_changed(changed)
        self._stored.applied(d for _, _, digests in entries for d in digests)
        self._mark_applied(entries[-1][0])

    def _mark_applied(self, sequence: int) -> None:
        with self._cond:
            self.applied = sequence
            self._cond.notify_all()

    def _set_aside(self, entry: Entry, error: Exception) -> None:
        """Keep a request that can never be applied in `wal/set-aside/` for a person to look at, and move on."""
        sequence, payload, digests = entry
        folder = self._wal.folder / "set-aside"
        folder.mkdir(mode=0o700, exist_ok=True)
        kept = folder / f"entry-{sequence:020d}.bin"
        with open(os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as file:
            file.write(payload if isinstance(payload, bytes) else payload.encode())
        self._target.skip(sequence)
        self._metrics.entries_set_aside += 1
        logger.error("logged request %d can never be applied (%s); it is kept in %s", sequence, error, kept)
        try:
            columns = entry_parts(payload)[0]
        except REFUSED_FOR_GOOD:
            columns = {}  # not even readable: it names no run whose state could be wrong
        self._stored.set_aside(digests)
        with self._cond:
            self._set_aside_runs.update(r for table in columns.values() for r in table.get("run_id", ()))
        self._mark_applied(sequence)

    def _apply_forever(self) -> None:
        backoff = 0.05
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
                deadline = time.monotonic() + APPLY_LINGER_SECONDS
                while (
                    not self._closing
                    and not self._readers_waiting
                    and len(self._pending) < APPLY_BATCH_ENTRIES
                    and (left := deadline - time.monotonic()) > 0
                ):
                    self._cond.wait(left)
                entries, self._pending = self._pending, []
            started = time.perf_counter()
            try:
                self._commit(entries)
            except Exception as error:
                # A passing failure: keep what is not applied for the next round. Readers stop
                # waiting for it and ingest refuses until a round succeeds.
                self._metrics.apply_failures += 1
                logger.error("the recorder cannot write its database (%s); retrying in %.2fs", error, backoff)
                with self._cond:
                    self.stalled = f"the recorder cannot write its database now: {error}"
                    self._pending = [entry for entry in entries if entry[0] > self.applied] + self._pending
                    self._cond.notify_all()
                    if self._closing:
                        return  # the log keeps the rest; the next start applies it
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if self.stalled is not None:
                logger.warning("the recorder can write its database again")
                with self._cond:
                    self.stalled = None
            backoff = 0.05
            self._metrics.apply_batches += 1
            self._metrics.apply_seconds += time.perf_counter() - started
            self._wal.release(self.applied)
