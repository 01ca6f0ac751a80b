"""The DuckDB store: validated ingest through a write-ahead log, columnar batch applies, and the reads.

Ingest is sequential (one lock): each request's records are checked against
per-run state (registration, applied keys, the last snapshot's references),
staged column-wise (`batch.py`), appended to the write-ahead log, and
acknowledged. One applier thread moves everything pending into DuckDB in a
single transaction per round, so commits are few and large however many
agents send. Reads first wait until everything acknowledged before them is
applied, so a reader never misses an acknowledged record.

Per-run state lives in memory and is loaded from the database the first time
a run is seen after start-up; it runs ahead of DuckDB only by what the log
already holds durably. It is kept within a memory budget (`RunStates`); idle
runs beyond it are dropped and loaded again when they come back.

A full or unwritable disk stalls the applier and refuses ingest (`StoreUnavailable`,
which the exporters retry) without blocking reads, which then see what is applied;
both go on by themselves when space returns. A logged request DuckDB refuses for good
(it cannot happen with validated input, but a recorder must not wedge on one) is set
aside in `wal/set-aside/` and logged, and the applier goes on with the rest.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import importlib.util
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from steprec.proto import wire
from steprec.proto.sized_cache import SizedCache

from ..daemon.metrics import MemoryUse, Metrics
from ..ingest.decode import (
    Malformed,
    MessageFragmentRecord,
    Refusal,
    SnapshotRecord,
    StepEventRecord,
    StepRecord,
    ToolEffectRecord,
)
from ..querier.sql import (
    ANCESTORS,
    DESCENDANT_DEPTHS,
    DESCENDANTS,
    DESCENDANTS_ORDER,
    OUTCOME,
    Deadline,
    QueryLimits,
    QueryRun,
    SqlTimeout,
    install_views,
    lock_down,
)
from .batch import ENDING_KINDS, Batch, entry_parts, insert, to_arrow
from .digests import DigestFilter
from .media import DEFAULT_THRESHOLD, URI_PREFIX, LocalMediaStore, MediaCodec, MediaCorrupt, MediaStore
from .message_cache import DEFAULT_CACHE_BYTES, message_cache
from .run_state import DEFAULT_RUN_STATE_BYTES, RunState, RunStates
from .schema import migrate
from .snapshot_choices import SnapshotChoices
from .tree import deeper_descendants, link, unlink
from .wal import WriteAheadLog

logger = logging.getLogger(__name__)


class _MissingPandas(importlib.abc.MetaPathFinder):
    """Answers "no pandas" at once, without walking sys.path (see `skip_pandas_lookups`)."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas":
            raise ModuleNotFoundError("No module named 'pandas'", name="pandas")
        return None


def skip_pandas_lookups() -> None:
    """Make DuckDB's per-parameter `import pandas` free in a process that has no pandas.

    DuckDB's Python client tries `import pandas` for every parameter it binds; without pandas
    installed (the recorder never needs it) each try walks sys.path again, 0.3-1.3 ms per
    statement (measured, docs/benchmarks.md). The daemon calls this at start; it changes nothing
    where pandas is installed, and puts nothing in sys.modules that others might mistake for it.
    """
    if importlib.util.find_spec("pandas") is None and not any(isinstance(f, _MissingPandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _MissingPandas())


BLOCK_SIZE = 16 * 1024
STORAGE_VERSION = "v1.5.0"
"""DuckDB storage format: new enough for ZSTD-compressed strings; readable by duckdb >= 1.5."""
APPLY_LINGER_SECONDS = 0.5
"""How long the applier lets acknowledged requests gather before a commit, unless a reader is waiting.

Fewer, larger commits keep DuckDB's commit cost (and its hold on the GIL) off
the ingest path; readers never wait for the linger, they cut it short.
"""
APPLY_BATCH_ENTRIES = 4096

FULL_REFS_EVERY = 32
"""A snapshot stores its whole reference list after this many deltas, bounding the chain a read walks."""

MAX_ASSEMBLY_BYTES = 1 << 30
"""Unfinished large messages the recorder holds in memory at most (1 GiB); the oldest give way."""
DEFAULT_MEMORY_LIMIT_MIB = 1024
"""DuckDB's memory limit unless the recorder is told otherwise (`--duckdb-memory-mib`)."""
SNAPSHOT_CACHE_BYTES = 32 << 20
"""Snapshots read lately, their info and the reference list rebuilt from their delta chain (32 bytes per
message: 500 snapshots of 2,000 messages), so reading one again costs at most the statement that picks its row
(none while `SnapshotChoices` keeps that answer), not three."""


_SNAPSHOT_INFO = (
    "run_id, snapshot_index, step_index, state, epoch_ns(recorded_at) AS at_ns, conversation_id, parent_run_id,"
    " agent_name, idempotency_key, message_count, write_seq"
)


def _snapshot_filter(run_id: str, *, include_interrupted: bool, snapshot_index: int | None = None) -> tuple[str, list]:
    """The retained snapshots of a run a read may pick: complete ones only unless told, or the given index."""
    filters, params = ["run_id = ?", "NOT pruned"], [run_id]
    if snapshot_index is not None:
        filters.append("snapshot_index = ?")
        params.append(snapshot_index)
    elif not include_interrupted:
        filters.append("state = 'complete'")
    return " AND ".join(filters), params


def _snapshot_size(entry: tuple[dict, bytes]) -> int:
    return sys.getsizeof(entry[1]) + 512  # the info dict, roughly


class StoreUnavailable(Exception):
    """The store cannot take this write now (its disk is full or unwritable); the sender should retry."""


_REFUSED_FOR_GOOD = (
    duckdb.ConversionException, duckdb.ConstraintException, duckdb.InvalidInputException,
    duckdb.BinderException, duckdb.CatalogException, duckdb.TypeMismatchException,
    pa.ArrowException, ValueError, TypeError, KeyError, EOFError, OverflowError,
)  # fmt: skip
"""Errors of a logged request itself: applying it again can never succeed, so it is set aside.

Anything else (a full disk, an I/O error, DuckDB out of memory) is retried: setting aside an
acknowledged request on a passing failure would lose it.
"""


def _json_object_text(data: bytes) -> str:
    try:
        text = data.decode()
        if isinstance(json.loads(text), dict):
            return text
    except ValueError:
        pass
    raise Malformed("bad_body", "a reassembled message is not a UTF-8 JSON object")


class DuckDBStore:
    """A steprec database in one DuckDB file."""

    def __init__(
        self,
        path: Path,
        *,
        fsync: bool = False,
        max_snapshots_per_run: int | None = None,
        memory_limit_mib: int = DEFAULT_MEMORY_LIMIT_MIB,
        media_threshold: int = DEFAULT_THRESHOLD,
        media_store: MediaStore | None = None,
        message_cache_bytes: int = DEFAULT_CACHE_BYTES,
        run_state_bytes: int = DEFAULT_RUN_STATE_BYTES,
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        new = not path.exists()
        self.path = path
        # 16 KiB blocks instead of DuckDB's 256 KiB: a recorder holds many small tables and indexes,
        # and a 200-step run then takes under 1 MB instead of 3.4 MB (measured; docs/storage.md).
        self._connection = duckdb.connect(
            str(path),
            config={"default_block_size": str(BLOCK_SIZE), "storage_compatibility_version": STORAGE_VERSION},
        )
        # DuckDB's own default is 80% of the machine's memory: a sidecar's page cache would grow
        # with the data until then (the soak in docs/reliability.md watched it grow).
        self._connection.execute(f"SET memory_limit = '{int(memory_limit_mib)}MiB'")
        if new:
            os.chmod(path, 0o600)
        migrate(self._connection)
        install_views(self._connection)
        lock_down(self._connection)
        self._write_lock = threading.Lock()
        self._states = RunStates(run_state_bytes)
        self._default_max_snapshots = max_snapshots_per_run
        media_store = media_store or LocalMediaStore(path.parent / "media", fsync=fsync)
        self._media = MediaCodec(media_store, threshold=media_threshold)
        self._bodies = message_cache(message_cache_bytes)
        self._snapshots = SizedCache[tuple[str, int], tuple[dict, bytes]](SNAPSHOT_CACHE_BYTES, size=_snapshot_size)
        self._choices = SnapshotChoices()
        self.metrics = Metrics()
        self._fragments: dict[bytes, dict[int, bytes]] = {}
        self._wal = WriteAheadLog(path.parent / "wal", fsync=fsync)
        self._cond = threading.Condition()
        self._pending: list[tuple[int, Batch, set[bytes]]] = []
        self._pending_digests: set[bytes] = set()
        self._closing = False
        self._readers_waiting = 0
        self._stalled: str | None = None
        """Why the applier cannot write DuckDB now (a full disk), or None while it can."""
        self._set_aside_runs: set[str] = set()
        """Runs of requests the applier set aside, whose in-memory state ingest must drop."""
        self._stale_runs: dict[str, int] = {}
        """Runs whose state must be reloaded, and the log sequence that must be applied first."""
        self._applied = self._fetch_one("SELECT applied_seq FROM steprec_wal")
        self._wal.skip_to(self._applied)
        self._recover()
        self._applier = threading.Thread(target=self._apply_forever, name="steprec-applier", daemon=True)
        self._applier.start()
        self._digests = self._load_digest_filter()
        self._run_ids = self._load_run_filter()
        self._next_seq = 1 + self._fetch_one(
            "SELECT greatest((SELECT max(write_seq) FROM runs), (SELECT max(write_seq) FROM events),"
            " (SELECT max(write_seq) FROM snapshots), (SELECT max(write_seq) FROM tool_effects), 0)"
        )

    def _fetch_one(self, query: str) -> object:
        """One value, read on a cursor that is closed at once.

        Never on the connection itself: a result left open there keeps its read transaction
        alive, and while it lives DuckDB can neither checkpoint (its own WAL grows without end)
        nor free the old row versions every later commit leaves behind (the recorder's memory
        grew by 0.7 MiB/s under load until this was found by the soak in docs/reliability.md).
        """
        with self._connection.cursor() as cursor:
            return cursor.execute(query).fetchone()[0]

    def close(self) -> None:
        """Apply everything acknowledged, then close the log and the database."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._applier.join()
        with self._write_lock:
            self._wal.close(applied=self._applied)
            self._connection.close()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A read cursor that sees every record acknowledged before this call (all that is applied, while stalled)."""
        self._wait_applied(self._wal.last_sequence, for_write=False)
        return self._connection.cursor()

    # -- the write-ahead log and its applier -------------------------------------------------

    def _recover(self) -> None:
        """Apply log entries a previous process acknowledged but did not apply, before serving."""
        entries = list(self._wal.entries_after(self._applied))
        for start in range(0, len(entries), 256):
            self._commit([(seq, payload, set()) for seq, payload in entries[start : start + 256]])
        if entries:
            logger.info("recovered %d acknowledged requests from the write-ahead log", len(entries))

    def _apply(self, entries: list[tuple[int, bytes | Batch, set[bytes]]]) -> None:
        tables = to_arrow([entry for _, entry, _ in entries])
        assembled = [digest for _, entry, _ in entries for digest in entry_parts(entry)[1]]
        pruned = [seq for _, entry, _ in entries for seq in entry_parts(entry)[2]]
        cursor = self._connection.cursor()
        try:
            cursor.execute("BEGIN")
            insert(cursor, tables)
            if "runs" in tables:  # their places in the run forest, and their late children's
                link(cursor, tables["runs"])
            if assembled:  # the whole message is in `messages` now; its pieces are redundant
                cursor.execute("DELETE FROM message_fragments WHERE list_contains(?, digest)", [assembled])
            if pruned:
                cursor.execute(
                    "UPDATE snapshots SET pruned = true, refs = ''::BLOB WHERE list_contains(?, write_seq)", [pruned]
                )
            cursor.execute("UPDATE steprec_wal SET applied_seq = ?", [entries[-1][0]])
            cursor.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.TransactionException):  # a failed COMMIT already ended it
                cursor.execute("ROLLBACK")
            raise
        finally:
            cursor.close()
        if "snapshots" in tables:  # retention prunes only runs with a snapshot in the same entry
            self._choices.changed(pc.unique(tables["snapshots"]["run_id"]).to_pylist())

    def _commit(self, entries: list[tuple[int, bytes | Batch, set[bytes]]]) -> None:
        """Apply `entries` in one transaction, or if DuckDB refuses one of them for good, each alone.

        A refused entry is set aside and the others are applied. A passing failure (a full
        disk) raises, with every entry before the failing one applied and marked so.
        """
        try:
            self._apply(entries)
        except _REFUSED_FOR_GOOD as error:
            if len(entries) == 1:
                self._set_aside(entries[0], error)
            else:
                for entry in entries:
                    self._commit([entry])
            return
        self._mark_applied(entries)

    def _mark_applied(self, entries: list[tuple[int, bytes | Batch, set[bytes]]]) -> None:
        with self._cond:
            self._applied = entries[-1][0]
            for _, _, digests in entries:
                self._pending_digests -= digests
            self._cond.notify_all()

    def _set_aside(self, entry: tuple[int, bytes | Batch, set[bytes]], error: Exception) -> None:
        """Keep a request that can never be applied in `wal/set-aside/` for a person to look at, and move on."""
        sequence, payload, _ = entry
        folder = self._wal.folder / "set-aside"
        folder.mkdir(mode=0o700, exist_ok=True)
        kept = folder / f"entry-{sequence:020d}.bin"
        with open(os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as file:
            file.write(payload if isinstance(payload, bytes) else payload.encode())
        with self._connection.cursor() as cursor:
            cursor.execute("UPDATE steprec_wal SET applied_seq = ?", [sequence])
        self.metrics.entries_set_aside += 1
        logger.error("logged request %d can never be applied (%s); it is kept in %s", sequence, error, kept)
        try:
            columns = entry_parts(payload)[0]
        except _REFUSED_FOR_GOOD:
            columns = {}  # not even readable: it names no run whose state could be wrong
        with self._cond:
            self._set_aside_runs.update(r for table in columns.values() for r in table.get("run_id", ()))
        self._mark_applied([entry])

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
                self.metrics.apply_failures += 1
                logger.error("the recorder cannot write its database (%s); retrying in %.2fs", error, backoff)
                with self._cond:
                    self._stalled = f"the recorder cannot write its database now: {error}"
                    self._pending = [entry for entry in entries if entry[0] > self._applied] + self._pending
                    self._cond.notify_all()
                    if self._closing:
                        return  # the log keeps the rest; the next start applies it
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if self._stalled is not None:
                logger.warning("the recorder can write its database again")
                with self._cond:
                    self._stalled = None
            backoff = 0.05
            self.metrics.apply_batches += 1
            self.metrics.apply_seconds += time.perf_counter() - started
            self._wal.release(self._applied)

    def _load_digest_filter(self) -> DigestFilter:
        """A filter over the stored message digests; rebuilt, bigger, when it fills up."""
        return self._load_filter("SELECT digest FROM messages", bytes)

    def _load_run_filter(self) -> DigestFilter:
        """A filter over every run id any table holds, so a new run's state needs no lookups."""
        return self._load_filter(
            "SELECT DISTINCT run_id FROM (SELECT run_id FROM runs UNION ALL SELECT run_id FROM events"
            " UNION ALL SELECT run_id FROM snapshots UNION ALL SELECT run_id FROM tool_effects)",
            _run_key,
        )

    def _load_filter(self, query: str, key) -> DigestFilter:
        """A filter sized for twice what `query` lists now, holding `key(value)` of each value (streamed)."""
        loaded = DigestFilter(capacity=max(1 << 20, 2 * self._fetch_one(f"SELECT count(*) FROM ({query})")))
        with self._connection.cursor() as cursor:
            for batch in cursor.execute(query).to_arrow_reader():
                for value in batch.column(0).to_pylist():
                    loaded.add(key(value))
        return loaded

    def prune(
        self, *, started_before_ns: int | None, conversation_id: str | None, dry_run: bool = False
    ) -> PruneResult:
        """Remove whole runs (and their events, snapshots and tool effects), then unreferenced messages.

        Holds the ingest lock for its duration and first waits until everything
        acknowledged is applied, so it never races a write it cannot see.
        """
        if started_before_ns is None and conversation_id is None:
            raise ValueError("prune needs an age or a conversation; refusing to remove every run")
        with self._write_lock:
            self._wait_applied(self._wal.last_sequence, for_write=True)
            cursor = self._connection.cursor()
            try:
                filters, params = [], []
                if started_before_ns is not None:
                    filters.append("epoch_ns(started_at) < ?")
                    params.append(started_before_ns)
                if conversation_id is not None:
                    filters.append("conversation_id = ?")
                    params.append(conversation_id)
                cursor.execute("BEGIN")
                where = " AND ".join(filters)
                # The runs as a table, matched by hash join: list_contains over a list of every pruned run scanned
                # the list per row (100,000 runs over 1,000,000 events: 63 s a statement, the write lock held).
                pruned = cursor.execute(f"SELECT DISTINCT run_id FROM runs WHERE {where}", params).to_arrow_table()
                cursor.register("pruned_runs", pruned)
                counts = {}
                for table in ("events", "run_endings", "snapshots", "tool_effects", "runs"):
                    matched = f"{table} WHERE run_id IN (SELECT run_id FROM pruned_runs)"
                    counts[table] = cursor.execute(f"SELECT count(*) FROM {matched}").fetchone()[0]
                    cursor.execute(f"DELETE FROM {matched}")
                unlink(cursor, pruned)
                cursor.unregister("pruned_runs")
                referenced = pa.table({"digest": pa.array(list(_referenced_digests(cursor)), pa.binary())})
                cursor.register("referenced", referenced)
                messages, message_bytes = cursor.execute(
                    "SELECT count(*), coalesce(sum(size_bytes), 0) FROM messages ANTI JOIN referenced USING (digest)"
                ).fetchone()
                cursor.execute("DELETE FROM messages WHERE digest NOT IN (SELECT digest FROM referenced)")
                cursor.unregister("referenced")
                cursor.execute("DELETE FROM media_refs WHERE digest NOT IN (SELECT digest FROM messages)")
                blobs_in_use = {uri for (uri,) in cursor.execute("SELECT DISTINCT uri FROM media_refs").fetchall()}
                cursor.execute("ROLLBACK" if dry_run else "COMMIT")
                if not dry_run:
                    self._choices.changed_all()
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
            finally:
                cursor.close()
            media_blobs = media_bytes = 0
            if not dry_run:
                # Every run's notion of which messages the store holds may be stale now.
                self._states.clear()
                media_blobs, media_bytes = self._media.store.collect_garbage(blobs_in_use)
            return PruneResult(
                runs=counts["runs"], events=counts["events"], snapshots=counts["snapshots"],
                tool_effects=counts["tool_effects"], messages=messages, message_bytes=message_bytes,
                media_blobs=media_blobs, media_bytes=media_bytes,
            )  # fmt: skip

    @property
    def pending_entries(self) -> int:
        return len(self._pending)

    def memory_use(self) -> MemoryUse:
        """What each bounded memory holds now. Call it where ingest runs (the event loop): it reads ingest's state."""
        return MemoryUse(
            duckdb=int(self._fetch_one("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()")),
            message_cache=self._bodies.bytes,
            message_cache_entries=self._bodies.entries,
            run_state=self._states.bytes,
            run_states=len(self._states),
            assembly=sum(len(piece) for pieces in self._fragments.values() for piece in pieces.values()),
            filters=self._digests.nbytes + self._run_ids.nbytes,
            arrow=pa.total_allocated_bytes(),
        )

    def _wait_applied(self, sequence: int, *, for_write: bool) -> None:
        """Wait until everything logged up to `sequence` is in DuckDB.

        While the applier is stalled (a full disk) nothing waits for it: a write is refused
        with StoreUnavailable, a read goes on with what is applied.
        """
        with self._cond:
            if self._applied >= sequence:
                return
            self._readers_waiting += 1
            self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: self._applied >= sequence or self._stalled is not None)
            finally:
                self._readers_waiting -= 1
            if self._applied < sequence and for_write:
                raise StoreUnavailable(self._stalled)

    # -- ingest ----------------------------------------------------------------------------------

    def ingest(self, records: Iterable[StepRecord]) -> tuple[list[Refusal], int]:
        """Log one request's records as one entry; returns the refusals and how many replays were suppressed.

        Raises StoreUnavailable when nothing of it could be logged (a full disk): the sender retries.
        """
        records = list(records)
        with self._write_lock:
            self._forget_stale_states({record.lineage.run_id for record in records})
            if self._digests.full or self._run_ids.full:
                self._wait_applied(self._wal.last_sequence, for_write=True)
                self._digests = self._load_digest_filter()
                self._run_ids = self._load_run_filter()
            cursor = _CursorOnDemand(self._connection)  # sees only applied rows; state covers the rest
            batch = Batch()
            refusals: list[Refusal] = []
            suppressed = 0
            staged_digests: set[bytes] = set()
            touched: set[str] = set()
            try:
                for record in records:
                    run_id = record.lineage.run_id
                    touched.add(run_id)
                    state = self._state(cursor, run_id)
                    try:
                        if isinstance(record, MessageFragmentRecord):
                            applied = self._stage_fragment(cursor, record, batch, staged_digests)
                        elif isinstance(record, StepEventRecord):
                            applied = self._stage_event(record, state, batch)
                        elif isinstance(record, SnapshotRecord):
                            applied = self._stage_snapshot(cursor, record, state, batch, staged_digests)
                        else:
                            applied = self._stage_tool_effect(record, state, batch)
                        suppressed += not applied
                    except Malformed as error:
                        refusals.append(Refusal(record.lineage.index, error.code, str(error)))
                sequence = None
                if batch:
                    sequence = self._wal.append(batch.encode())
                    with self._cond:
                        self._pending.append((sequence, batch, staged_digests))
                        self._pending_digests |= staged_digests
                        self._cond.notify_all()
                self._states.touch(touched, sequence)
            except BaseException as error:
                # Nothing of this request is durable, but its runs' state may already count part of
                # it: load that state again once everything logged before it is applied.
                for run_id in touched:
                    self._states.drop(run_id)
                    self._stale_runs[run_id] = self._wal.last_sequence
                self._fragments.clear()
                if isinstance(error, OSError):
                    raise StoreUnavailable(f"the recorder cannot write its log now: {error}") from error
                raise
            finally:
                cursor.close()
            self._states.forget_idle(self._applied, keep=touched)
            return refusals, suppressed

    def _forget_stale_states(self, run_ids: set[str]) -> None:
        """Drop the state of runs a failed write or a set-aside request left wrong, or refuse while it
        cannot be loaded again yet (earlier requests are still to be applied)."""
        with self._cond:
            for run_id in self._set_aside_runs:
                self._stale_runs[run_id] = self._wal.last_sequence
            self._set_aside_runs.clear()
        for run_id in run_ids & self._stale_runs.keys():
            if self._applied < self._stale_runs[run_id]:
                raise StoreUnavailable(self._stalled or f"run {run_id!r} waits for its earlier records to be applied")
            del self._stale_runs[run_id]
            self._states.drop(run_id)

    def _seq(self) -> int:
        self._next_seq += 1
        return self._next_seq - 1

    def _state(self, cursor: duckdb.DuckDBPyConnection, run_id: str) -> RunState:
        """What ingest knows of a run: kept in memory once seen, else loaded from the database.

        A run the run-id filter has never seen starts empty with no query at all: with 100,000
        short runs, four lookups per new run were most of the ingest time (docs/benchmarks.md).
        """
        if (state := self._states.get(run_id)) is not None:
            return state
        key = _run_key(run_id)
        if not self._run_ids.might_contain(key):
            self._run_ids.add(key)
            state = RunState(max_snapshots=self._default_max_snapshots)
            self._states.add(run_id, state)
            return state
        state = RunState()
        row = cursor.execute(
            "SELECT registration_id, max_snapshots, write_seq FROM runs WHERE run_id = ? LIMIT 1", [run_id]
        ).fetchone()
        state.registration_id, state.max_snapshots, state.run_seq = row or (None, self._default_max_snapshots, None)
        for (k,) in cursor.execute(
            "SELECT idempotency_key FROM events WHERE run_id = ? AND idempotency_key IS NOT NULL", [run_id]
        ).fetchall():
            state.add_event_key(k)
        state.ended = bool(cursor.execute("SELECT 1 FROM run_endings WHERE run_id = ? LIMIT 1", [run_id]).fetchone())
        for (k,) in cursor.execute(
            "SELECT record_key FROM tool_effects WHERE run_id = ? AND record_key IS NOT NULL", [run_id]
        ).fetchall():
            state.add_effect_key(k)
        rows = cursor.execute(
            "SELECT idempotency_key, snapshot_index, base_index, write_seq, state, pruned FROM snapshots"
            " WHERE run_id = ? ORDER BY write_seq",
            [run_id],
        ).fetchall()
        for key, *_ in rows:
            if key is not None:
                state.note_snapshot_key(key)
        snapshots = [row for row in rows if not row[5]]
        state.set_retained([(seq, snapshot_state, key) for key, _, _, seq, snapshot_state, _ in snapshots])
        if snapshots:
            state.last_index = snapshots[-1][1]
            state.last_refs = wire.split_digests(self._rebuild_refs(cursor, run_id, state.last_index))
            state.known_digests = set(state.last_refs)
            depth = 0
            for _, _, base, *_ in reversed(snapshots):
                if base is None:
                    break
                depth += 1
            state.chain_depth = depth
        self._states.add(run_id, state)
        return state

    @staticmethod
    def _lineage_columns(record: StepRecord) -> dict[str, object]:
        lineage = record.lineage
        return {
            "run_id": lineage.run_id,
            "step_index": lineage.step_index,
            "recorded_at": lineage.at_unix_nano,
            "conversation_id": lineage.conversation_id,
            "parent_run_id": lineage.parent_run_id,
            "agent_name": lineage.agent_name,
            "idempotency_key": lineage.idempotency_key,
            "trace_id": lineage.trace_id,
            "span_id": lineage.span_id,
        }

    def _stage_event(self, record: StepEventRecord, state: RunState, batch: Batch) -> bool:
        lineage = record.lineage
        if record.kind == "run_started":
            if state.registration_id is not None and state.registration_id != record.registration_id:
                raise Malformed(
                    wire.REFUSED_RUN_ID_TAKEN,
                    f"run_id {lineage.run_id!r} is already registered by another Agent.run; run ids are single-use",
                )
            if state.registration_id is None:
                state.registration_id = record.registration_id
                state.run_seq = self._seq()
                if record.max_snapshots is not None:
                    state.max_snapshots = record.max_snapshots
                batch.add(
                    "runs",
                    **self._lineage_columns(record),
                    write_seq=state.run_seq,
                    registration_id=record.registration_id,
                    metadata=list(record.metadata.items()),
                    started_at=lineage.at_unix_nano,
                    max_snapshots=state.max_snapshots,  # resolved: the run's own bound or the default
                    forked_from_run_id=record.forked_from_run_id,
                    forked_from_snapshot_index=record.forked_from_snapshot,
                )
        key = lineage.idempotency_key
        if key is not None and not state.add_event_key(key):
            return False
        write_seq = self._seq()
        if record.kind in ENDING_KINDS:
            if state.ended:
                batch.add("superseded_endings", run_id=lineage.run_id, write_seq=write_seq)
            state.ended = True
            batch.add("run_endings", write_seq=write_seq, run_id=lineage.run_id, kind=record.kind,
                      ended_at=lineage.at_unix_nano, run_seq=state.run_seq)  # fmt: skip
        batch.add(
            "events",
            **self._lineage_columns(record),
            write_seq=write_seq,
            kind=record.kind,
            tool_call_id=record.tool_call_id,
            tool_name=record.tool_name,
            error=record.error,
            metadata=list(record.metadata.items()),
        )
        return True

    def _stage_message(self, batch: Batch, digest: bytes, text: str, size: int) -> None:
        """Store a new message once, its media as blobs, and which blobs it refers to."""
        body, offloaded = self._media.externalize(text)
        batch.add("messages", digest=digest, body=body, size_bytes=size)
        self._bodies.put(digest, body)
        for uri, blob_bytes in offloaded:
            batch.add("media_refs", digest=digest, uri=uri, size_bytes=blob_bytes)

    def _stage_fragment(
        self,
        cursor: duckdb.DuckDBPyConnection,
        record: MessageFragmentRecord,
        batch: Batch,
        staged_digests: set[bytes],
    ) -> bool:
        """Keep a piece of a large message; when the last piece is in, store the message whole."""
        digest = record.digest
        if digest in staged_digests or self._stored_digests(cursor, {digest}):
            return False
        parts = self._fragments.get(digest)
        if parts is None:
            self._wait_applied(self._wal.last_sequence, for_write=True)  # pieces from before a restart are in the table
            rows = cursor.execute(
                "SELECT fragment_index, data FROM message_fragments WHERE digest = ?", [digest]
            ).fetchall()
            parts = self._fragments[digest] = {index: bytes(data) for index, data in rows}
        if record.index in parts:
            return False
        if any(index >= record.count for index in parts):
            raise Malformed(
                "bad_attribute", f"fragment count {record.count} disagrees with pieces of this message held"
            )
        self._make_room_for_assembly(digest, len(record.data))
        parts[record.index] = record.data
        batch.add("message_fragments", digest=digest, fragment_index=record.index,
                  fragment_count=record.count, data=record.data)  # fmt: skip
        if any(index not in parts for index in range(record.count)):
            return True
        whole = b"".join(parts[i] for i in range(record.count))
        del self._fragments[digest]
        if hashlib.sha256(whole).digest() != digest:
            raise Malformed("bad_body", "the fragments of a message do not add up to its digest")
        self._stage_message(batch, digest, _json_object_text(whole), len(whole))
        batch.assembled.append(digest)
        staged_digests.add(digest)
        self._digests.add(digest)
        return True

    def _make_room_for_assembly(self, digest: bytes, size: int) -> None:
        """Forget the oldest other unfinished messages until `size` more bytes fit under MAX_ASSEMBLY_BYTES.

        Their pieces are logged, so one that resumes is loaded again from the table; a sender that
        abandons large messages can therefore not lock others out until a restart.
        """
        held = {d: sum(map(len, pieces.values())) for d, pieces in self._fragments.items()}
        if held[digest] + size > MAX_ASSEMBLY_BYTES:
            raise Malformed("too_large", f"a message of more than {MAX_ASSEMBLY_BYTES} bytes")
        total = sum(held.values())
        for other in [d for d in self._fragments if d != digest]:
            if total + size <= MAX_ASSEMBLY_BYTES:
                break
            total -= held[other]
            del self._fragments[other]

    def _stage_tool_effect(self, record: ToolEffectRecord, state: RunState, batch: Batch) -> bool:
        key = record.lineage.idempotency_key
        if key is not None and not state.add_effect_key(key):
            return False
        columns = self._lineage_columns(record)
        columns["record_key"] = columns.pop("idempotency_key")
        batch.add(
            "tool_effects",
            **columns,
            write_seq=self._seq(),
            tool_call_id=record.tool_call_id,
            tool_name=record.tool_name,
            status=record.status,
            error=record.error,
            idempotency_key=record.idempotency_key,
            effect_summary=record.effect_summary,
        )
        return True

    def _stage_snapshot(
        self,
        cursor: duckdb.DuckDBPyConnection,
        record: SnapshotRecord,
        state: RunState,
        batch: Batch,
        staged_digests: set[bytes],
    ) -> bool:
        key = record.lineage.idempotency_key
        if key is not None and state.seen_snapshot_key(key):
            return False
        if record.base_index is None:
            base: tuple[bytes, ...] = ()
        elif record.base_index == state.last_index:
            base = state.last_refs
        else:
            self._wait_applied(self._wal.last_sequence, for_write=True)  # the base may still be in the log
            base = wire.split_digests(self._rebuild_refs(cursor, record.lineage.run_id, record.base_index))
            if not base and record.keep:
                raise Malformed("unknown_base", f"snapshot base {record.base_index} of this run was never stored")
        if record.keep > len(base):
            raise Malformed("bad_attribute", f"keep {record.keep} exceeds the {len(base)} messages of its base")
        refs = base[: record.keep] + record.append_refs
        bodies = {}
        for text in record.messages:
            encoded = text.encode()
            bodies[hashlib.sha256(encoded).digest()] = (text, len(encoded))
        unknown = {r for r in record.append_refs if r not in state.known_digests and r not in bodies}
        if unknown:
            unknown -= self._stored_digests(cursor, unknown) | staged_digests
            if unknown:
                raise Malformed(
                    "unknown_message",
                    f"snapshot references {len(unknown)} message(s) the recorder never received",
                )
        new_digests = [d for d in bodies if d not in state.known_digests and d not in staged_digests]
        already_stored = self._stored_digests(cursor, set(new_digests)) if new_digests else set()
        for digest in new_digests:
            if digest not in already_stored:
                text, size = bodies[digest]
                self._stage_message(batch, digest, text, size)
                staged_digests.add(digest)
                self._digests.add(digest)
        # A run under retention stores whole reference lists: pruning then never breaks a chain.
        store_full = record.base_index is None or state.chain_depth + 1 >= FULL_REFS_EVERY or bool(state.max_snapshots)
        write_seq = self._seq()
        batch.add(
            "snapshots",
            **self._lineage_columns(record),
            write_seq=write_seq,
            snapshot_index=record.snapshot_index,
            state=record.state,
            base_index=None if store_full else record.base_index,
            keep=0 if store_full else record.keep,
            refs=b"".join(refs if store_full else record.append_refs),
            message_count=len(refs),
        )
        batch.pruned.extend(state.retain(write_seq, record.state, key))
        state.known_digests.update(refs)
        state.last_index, state.last_refs = record.snapshot_index, refs
        state.chain_depth = 0 if store_full else state.chain_depth + 1
        return True

    def _stored_digests(self, cursor: duckdb.DuckDBPyConnection, digests: set[bytes]) -> set[bytes]:
        """Which of `digests` the store holds, in DuckDB or still in the log."""
        with self._cond:
            pending = digests & self._pending_digests
        digests = {d for d in digests - pending if self._digests.might_contain(d)}
        if not digests:
            return pending
        wanted = pa.table({"digest": pa.array(list(digests), pa.binary())})
        cursor.register("wanted_digests", wanted)
        try:
            rows = cursor.execute(
                "SELECT DISTINCT m.digest FROM messages m JOIN wanted_digests w ON m.digest = w.digest"
            ).fetchall()
        finally:
            cursor.unregister("wanted_digests")
        return pending | {bytes(d) for (d,) in rows}

    # -- reads -----------------------------------------------------------------------------------

    @staticmethod
    def _rebuild_refs(
        cursor: duckdb.DuckDBPyConnection, run_id: str, snapshot_index: int, written_by: int | None = None
    ) -> bytes:
        """The full reference list of one snapshot (32-byte digests, concatenated), rebuilt from its delta
        chain among the retained snapshots written by `written_by` (all when None).

        A base may be numbered higher than the snapshot on it (RecorderStepStore numbers a
        second key at one sequence from 2**30), and a sender reusing indexes can make bases
        form a cycle: the walk takes every retained snapshot and stops at an index it has seen.
        """
        rows = cursor.execute(
            "SELECT snapshot_index, base_index, keep, refs FROM snapshots"
            " WHERE run_id = ? AND NOT pruned AND write_seq <= ? ORDER BY write_seq",
            [run_id, written_by if written_by is not None else (1 << 63) - 1],
        ).fetchall()
        by_index = {index: (base, keep, bytes(refs)) for index, base, keep, refs in rows}
        chain, seen = [], set()
        index: int | None = snapshot_index
        while index is not None and index in by_index and index not in seen:
            seen.add(index)
            chain.append(by_index[index])
            index = by_index[index][0]
        refs = b""
        for _, keep, blob in reversed(chain):
            refs = refs[: keep * wire.DIGEST_SIZE] + blob
        return refs

    def list_snapshots(self, run_id: str, *, include_interrupted: bool) -> list[dict]:
        """The run's retained snapshots in write order, without their messages."""
        where, params = _snapshot_filter(run_id, include_interrupted=include_interrupted)
        cursor = self.cursor()
        try:
            return _dicts(
                cursor.execute(f"SELECT {_SNAPSHOT_INFO} FROM snapshots WHERE {where} ORDER BY write_seq", params)
            )
        finally:
            cursor.close()

    def read_snapshot(
        self, run_id: str, *, include_interrupted: bool, snapshot_index: int | None = None, digests_only: bool = False
    ) -> tuple[dict, list[str] | bytes] | None:
        """The newest snapshot (by write order), or the given retained one, and its messages' JSON (or, with
        `digests_only`, their digests concatenated); or None."""
        where, params = _snapshot_filter(run_id, include_interrupted=include_interrupted, snapshot_index=snapshot_index)
        cursor = self.cursor()
        try:
            write_seq = self._choices.choose(
                (run_id, include_interrupted, snapshot_index),
                lambda: cursor.execute(f"SELECT max(write_seq) FROM snapshots WHERE {where}", params).fetchone()[0],
            )
            if write_seq is None:
                return None
            info, refs = self._snapshot(cursor, run_id, write_seq)
            if digests_only:
                return info, refs
            return info, self._messages(cursor, wire.split_digests(refs))
        finally:
            cursor.close()

    def kept_snapshot(
        self, run_id: str, *, include_interrupted: bool, snapshot_index: int | None = None
    ) -> tuple[dict, bytes] | None:
        """What `read_snapshot(..., digests_only=True)` answers, when that needs neither DuckDB nor a wait for the
        applier (the answer is kept and everything acknowledged is applied); else None. Safe on an event loop."""
        with self._cond:
            if self._applied < self._wal.last_sequence:
                return None
        write_seq = self._choices.kept((run_id, include_interrupted, snapshot_index))
        return None if write_seq is None else self._snapshots.get((run_id, write_seq))

    def _snapshot(self, cursor: duckdb.DuckDBPyConnection, run_id: str, write_seq: int) -> tuple[dict, bytes]:
        """A snapshot row's info and whole reference list, built once and then kept (`_snapshots`): a written
        snapshot row never changes, and bounding its chain by the row's write sequence keeps later rows from
        changing what it rebuilds to. Which row to read is kept apart (`_choices`), until its run's snapshots change."""
        key = (run_id, write_seq)
        if (cached := self._snapshots.get(key)) is None:
            (info,) = _dicts(
                cursor.execute(
                    f"SELECT {_SNAPSHOT_INFO} FROM snapshots WHERE run_id = ? AND write_seq = ?", [run_id, write_seq]
                )
            )
            cached = info, self._rebuild_refs(cursor, run_id, info["snapshot_index"], write_seq)
            self._snapshots.put(key, cached)
        return cached

    def read_messages(self, digests: Sequence[bytes]) -> list[str]:
        """Stored messages by digest, in the order asked, media restored.

        Raises `LookupError` naming the first digest no stored message has.
        """
        cursor = self.cursor()
        try:
            return self._messages(cursor, digests)
        finally:
            cursor.close()

    def _messages(self, cursor: duckdb.DuckDBPyConnection, digests: Sequence[bytes]) -> list[str]:
        wanted = set(digests)
        bodies = self._bodies.get_many(wanted)
        if missing := wanted - bodies.keys():
            cursor.register("wanted_digests", pa.table({"digest": pa.array(list(missing), pa.binary())}))
            for digest, body in cursor.execute(
                "SELECT m.digest, any_value(m.body) FROM messages m JOIN wanted_digests w ON m.digest = w.digest"
                " GROUP BY m.digest"
            ).fetchall():
                bodies[bytes(digest)] = body
                self._bodies.put(bytes(digest), body)
            cursor.unregister("wanted_digests")
        if unknown := next((d for d in digests if d not in bodies), None):
            raise LookupError(f"no stored message has digest {unknown.hex()}")
        return [self._media.restore(bodies[d]) for d in digests]

    def get_run(self, run_id: str) -> dict | None:
        runs = self.list_runs(run_id=run_id)
        return runs[0] if runs else None

    def list_runs(
        self,
        *,
        run_id: str | None = None,
        conversation_id: str | None = None,
        parent_run_id: str | None = None,
        agent_name: str | None = None,
        forked_from_run_id: str | None = None,
        started_at_or_after_ns: int | None = None,
        started_before_ns: int | None = None,
        outcome: str | None = None,
        after: tuple[int, int] | None = None,
        limit: int | None = None,
    ) -> list[dict]:
        """Runs matching every given filter, by start instant then write order.

        `after` is the `(started_at_ns, write_seq)` of the last run of a previous page.
        """
        filters, params = [], []
        for column, value in (
            ("run_id", run_id),
            ("conversation_id", conversation_id),
            ("parent_run_id", parent_run_id),
            ("agent_name", agent_name),
            ("forked_from_run_id", forked_from_run_id),
        ):
            if value is not None:
                filters.append(f"r.{column} = ?")
                params.append(value)
        if started_at_or_after_ns is not None:
            filters.append("epoch_ns(r.started_at) >= ?")
            params.append(started_at_or_after_ns)
        if started_before_ns is not None:
            filters.append("epoch_ns(r.started_at) < ?")
            params.append(started_before_ns)
        if after is not None:
            filters.append("(epoch_ns(r.started_at) > ? OR (epoch_ns(r.started_at) = ? AND r.write_seq > ?))")
            params.extend([after[0], after[0], after[1]])
        chosen = f"SELECT r.*, 0 AS depth FROM runs r WHERE {' AND '.join(filters) or 'true'}"
        bound = f" LIMIT {int(limit)}" if limit else ""
        if outcome is not None:
            return self._runs("", chosen, params, f"WHERE outcome = ? ORDER BY started_at_ns, write_seq{bound}",
                              [outcome])  # fmt: skip
        return self._runs("", chosen, params, f"ORDER BY started_at_ns, write_seq{bound}", [])

    def _runs(
        self, prefix: str, chosen: str, params: list, tail: str, tail_params: list, *,
        timeout_seconds: float | None = None, prepare=None,
    ) -> list[dict]:  # fmt: skip
        """The runs `chosen` selects (all columns of `runs`, plus `depth`), with their outcome and end.

        Only the chosen runs' events are scanned, so a lookup costs the same in a store of any size.
        Past `timeout_seconds` the read is interrupted (SqlTimeout); `prepare` runs on its cursor first.
        """
        cursor = self.cursor()
        deadline = Deadline(cursor, timeout_seconds)
        try:
            if prepare is not None:
                prepare(cursor)
            return _dicts(
                cursor.execute(
                    f"""
                    {prefix}{"," if prefix else "WITH"} chosen AS ({chosen})
                    SELECT * FROM (
                        SELECT c.run_id, c.registration_id, c.conversation_id, c.parent_run_id, c.agent_name,
                               c.metadata, epoch_ns(c.started_at) AS started_at_ns, c.write_seq,
                               c.forked_from_run_id, c.forked_from_snapshot_index, c.depth,
                               epoch_ns(x.ended_at) AS ended_at_ns, {OUTCOME.format(kind="x.kind")} AS outcome
                        FROM chosen c LEFT JOIN main.run_endings x ON x.run_id = c.run_id
                    ) {tail}
                    """,
                    params + tail_params,
                )
            )
        except duckdb.Error:
            if deadline.expired.is_set():
                raise SqlTimeout(f"the read ran past its {timeout_seconds:g} s time limit") from None
            raise
        finally:
            deadline.close()
            cursor.close()

    def run_tree(self, run_id: str, *, ancestors: bool, timeout_seconds: float | None = None) -> list[dict]:
        """The run with its descendants and forks (or its ancestors), each row with its `depth` from the run.

        Descendants are a filter on the ancestry kept at ingest (tree.py); ancestors walk the parent links.
        """
        order = "ORDER BY depth, started_at_ns, write_seq"
        if ancestors:
            chosen = "SELECT r.*, d.depth FROM runs r JOIN depths d ON r.run_id = d.run_id"
            return self._runs(ANCESTORS, chosen, [run_id], order, [], timeout_seconds=timeout_seconds)
        chosen = "SELECT r.*, d.depth FROM runs r JOIN depths d ON r.write_seq = d.run_seq"
        return self._runs(DESCENDANT_DEPTHS, chosen, [run_id, run_id], order, [], timeout_seconds=timeout_seconds,
                          prepare=_deeper_registration(run_id))  # fmt: skip

    def descendants(self, run_id: str, limits: QueryLimits) -> QueryRun:
        """The run and everything below it as Arrow (sql.DESCENDANTS), under `limits`."""
        return QueryRun(
            self.cursor(), DESCENDANTS, limits, (run_id, run_id), prepare=_deeper_registration(run_id),
            sort_by=DESCENDANTS_ORDER,
        )  # fmt: skip

    def read_media(self, uri: str) -> bytes | None:
        """A blob a stored message refers to, checked against its digest; None for any other URI.

        Raises `MediaCorrupt` when the bytes found are not the ones the URI names.
        """
        cursor = self.cursor()
        try:
            known = cursor.execute("SELECT 1 FROM media_refs WHERE uri = ? LIMIT 1", [uri]).fetchone()
        finally:
            cursor.close()
        if known is None:
            return None
        data = self._media.store.get(uri)
        if URI_PREFIX + hashlib.sha256(data).hexdigest() != uri:
            raise MediaCorrupt(f"the stored bytes of {uri} do not match its digest")
        return data

    def query(self, query: str, limits: QueryLimits, params: tuple = ()) -> QueryRun:
        """A read-only SQL query over the views (sql.py), seeing every record acknowledged before it."""
        return QueryRun(self.cursor(), query, limits, params)

    def list_events(self, run_id: str) -> list[dict]:
        cursor = self.cursor()
        try:
            return _dicts(
                cursor.execute(
                    "SELECT run_id, kind, step_index, epoch_ns(recorded_at) AS at_ns, conversation_id, parent_run_id,"
                    " agent_name, tool_call_id, tool_name, error, metadata, idempotency_key, trace_id, span_id"
                    " FROM events WHERE run_id = ? ORDER BY write_seq",
                    [run_id],
                )
            )
        finally:
            cursor.close()

    def list_tool_effects(self, run_id: str, *, unresolved_only: bool, tool_call_id: str | None = None) -> list[dict]:
        """The run's ledger (the `tool_effects` view): per call the latest status, annotations kept."""
        cursor = self.cursor()
        try:
            return _dicts(
                cursor.execute(
                    "SELECT run_id, tool_call_id, tool_name, status, epoch_ns(started_at) AS started_at_ns,"
                    " epoch_ns(ended_at) AS ended_at_ns, idempotency_key, effect_summary FROM recorded.tool_effects"
                    " WHERE run_id = ? AND (?::VARCHAR IS NULL OR tool_call_id = ?) AND (NOT ? OR status = 'started')"
                    " ORDER BY seq",
                    [run_id, tool_call_id, tool_call_id, unresolved_only],
                )
            )
        finally:
            cursor.close()


class _CursorOnDemand:
    """A DuckDB cursor opened on first use: most requests are checked against in-memory run state alone,
    and opening and closing a cursor cost about an eighth of such a request's ingest time (measured)."""

    def __init__(self, connection: duckdb.DuckDBPyConnection) -> None:
        self._connection = connection
        self._cursor: duckdb.DuckDBPyConnection | None = None

    def __getattr__(self, name: str):
        if self._cursor is None:
            self._cursor = self._connection.cursor()
        return getattr(self._cursor, name)

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.close()


def _deeper_registration(run_id: str):
    """What a descendants read registers first: its descendants beyond one ancestry lookup, as `deeper`."""

    def register(cursor: duckdb.DuckDBPyConnection) -> None:
        cursor.register("deeper", deeper_descendants(cursor, run_id))

    return register


def _run_key(run_id: str) -> bytes:
    return hashlib.sha256(run_id.encode()).digest()


def _dicts(result: duckdb.DuckDBPyConnection) -> list[dict]:
    names = [d[0] for d in result.description]
    return [dict(zip(names, row, strict=True)) for row in result.fetchall()]


@dataclass(frozen=True)
class PruneResult:
    runs: int
    events: int
    snapshots: int
    tool_effects: int
    messages: int
    message_bytes: int
    media_blobs: int
    media_bytes: int


def _referenced_digests(cursor: duckdb.DuckDBPyConnection) -> set[bytes]:
    """Every digest a retained snapshot refers to: the union of all stored reference lists and deltas."""
    referenced: set[bytes] = set()
    for batch in cursor.execute("SELECT refs FROM snapshots WHERE NOT pruned").to_arrow_reader():
        for blob in batch.column(0).to_pylist():
            referenced.update(wire.split_digests(blob))
    return referenced
