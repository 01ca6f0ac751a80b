"""The write path: one request's records checked against per-run state, staged column-wise, logged.

Ingest is sequential (one lock): each request's records are checked against per-run state
(registration, applied keys, the last snapshot's references), staged column-wise (`batch.py`),
appended to the write-ahead log as one entry and handed to the applier; then the Export is
answered. Nothing here waits for DuckDB per request: per-run state lives in memory, loaded from
the database the first time a run is seen after start-up, and runs ahead of the database only by
what the log already holds durably. It is kept within a memory budget (`RunStates`); idle runs
beyond it are dropped and loaded again when they come back. Which messages are stored is asked
once per request (`StoredMessages`), and mostly answered from memory.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Sequence

import duckdb
from steprec.proto import wire
from steprec.proto.sized_cache import SizedCache

from ..ingest.decode import (
    Malformed,
    MessageFragmentRecord,
    Refusal,
    SnapshotRecord,
    StepEventRecord,
    StepRecord,
    ToolEffectRecord,
    check_message_json,
)
from ..lake.handoff import Holding, RunHandoff
from .applier import Applier, StoreUnavailable
from .batch import ENDING_KINDS, Batch
from .connection import CursorOnDemand, fetch_one
from .digests import DigestFilter
from .media import MediaCodec
from .run_state import RunState, RunStates
from .sequence import Counter, FleetClock
from .snapshot_refs import FULL_REFS_EVERY, rebuild_refs
from .stored_messages import StoredMessages
from .wal import WriteAheadLog

MAX_ASSEMBLY_BYTES = 1 << 30
"""Unfinished large messages the recorder holds in memory at most (1 GiB); the oldest give way."""

Bodies = dict[bytes, tuple[str, int, int]]
"""A snapshot's message bodies by digest, with their size in bytes and their place in `body.messages`."""


def run_key(run_id: str) -> bytes:
    """What the run-id filter holds of a run id."""
    return hashlib.sha256(run_id.encode()).digest()


def load_filter(connection: duckdb.DuckDBPyConnection, query: str, key) -> DigestFilter:
    """A filter sized for twice what `query` lists now, holding `key(value)` of each value (streamed)."""
    loaded = DigestFilter(capacity=max(1 << 20, 2 * fetch_one(connection, f"SELECT count(*) FROM ({query})")))
    with connection.cursor() as cursor:
        for batch in cursor.execute(query).to_arrow_reader():
            for value in batch.column(0).to_pylist():
                loaded.add(key(value))
    return loaded


def _json_object_text(data: bytes) -> str:
    try:
        text = data.decode()
        if isinstance(json.loads(text), dict):
            return text
    except ValueError:
        pass
    raise Malformed("bad_body", "a reassembled message is not a UTF-8 JSON object")


def _bodies(record: SnapshotRecord) -> Bodies:
    bodies = {}
    for position, text in enumerate(record.messages):
        encoded = text.encode()
        bodies[hashlib.sha256(encoded).digest()] = (text, len(encoded), position)
    return bodies


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


class _Request:
    """What staging one request needs besides run state: its batch, and which messages are stored."""

    def __init__(self, stored: set[bytes]) -> None:
        self.batch = Batch()
        self.stored = stored
        """Messages the store held as the request began (of those it carries)."""
        self.staged: set[bytes] = set()
        """Messages this request stores."""

    def holds(self, digest: bytes) -> bool:
        return digest in self.stored or digest in self.staged


class WritePath:
    """Validation against run state and staging; the one writer of the write-ahead log."""

    def __init__(
        self,
        connection: duckdb.DuckDBPyConnection,
        wal: WriteAheadLog,
        applier: Applier,
        stored: StoredMessages,
        media: MediaCodec,
        bodies: SizedCache[bytes, str],
        *,
        run_state_bytes: int,
        max_snapshots_per_run: int | None,
        sequence: FleetClock | None = None,
        handoff: RunHandoff | None = None,
    ) -> None:
        self.lock = threading.Lock()
        """Held for each request, and by prune for its whole duration."""
        self._connection = connection
        self._wal = wal
        self._applier = applier
        self._stored = stored
        self._media = media
        self._bodies = bodies
        self.states = RunStates(run_state_bytes)
        self._default_max_snapshots = max_snapshots_per_run
        self.fragments: dict[bytes, dict[int, bytes]] = {}
        self._stale_runs: dict[str, int] = {}
        """Runs whose state must be reloaded, and the log sequence that must be applied first."""
        self.run_ids = self._load_run_filter()
        self._handoff = handoff
        """Where a lake's recorders claim run ids and hand runs over (`lake.handoff`); None when this store is alone."""
        self._holding = Holding({}, set())
        """What holding the request at hand's runs answered."""
        self._seq = sequence or Counter(
            1
            + fetch_one(
                connection,
                "SELECT greatest((SELECT max(write_seq) FROM runs), (SELECT max(write_seq) FROM events),"
                " (SELECT max(write_seq) FROM snapshots), (SELECT max(write_seq) FROM tool_effects),"
                " (SELECT max(write_seq) FROM conversations), (SELECT max(write_seq) FROM conversation_heads), 0)",
            )
        )

    def _load_run_filter(self) -> DigestFilter:
        """A filter over every run id any table holds, so a new run's state needs no lookups."""
        return load_filter(
            self._connection,
            "SELECT DISTINCT run_id FROM (SELECT run_id FROM runs UNION ALL SELECT run_id FROM events"
            " UNION ALL SELECT run_id FROM snapshots UNION ALL SELECT run_id FROM tool_effects)",
            run_key,
        )

    def _wait_all_applied(self) -> None:
        self._applier.wait_applied(self._wal.last_sequence, for_write=True)

    def ingest(self, records: Iterable[StepRecord]) -> tuple[list[Refusal], int]:
        """Log one request's records as one entry; returns the refusals and how many replays were suppressed.

        Raises StoreUnavailable when nothing of it could be logged (a full disk): the sender retries.
        """
        records = list(records)
        with self.lock:
            self._forget_stale_states({record.lineage.run_id for record in records})
            self._hold(records)
            self._stored.reload_filter_if_full(self._wait_all_applied)
            if self.run_ids.full:
                self._wait_all_applied()
                self.run_ids = self._load_run_filter()
            cursor = CursorOnDemand(self._connection)  # sees only applied rows; state covers the rest
            bodies = {id(r): _bodies(r) for r in records if isinstance(r, SnapshotRecord)}
            request = _Request(self._stored.lookup(cursor, _carried(records, bodies)))
            refusals: list[Refusal] = []
            suppressed = 0
            touched: set[str] = set()
            try:
                for record in records:
                    run_id = record.lineage.run_id
                    touched.add(run_id)
                    state = self._state(cursor, run_id, moved_here=run_id in self._holding.moved_here)
                    try:
                        if isinstance(record, MessageFragmentRecord):
                            applied = self._stage_fragment(cursor, record, request)
                        elif isinstance(record, StepEventRecord):
                            applied = self._stage_event(record, state, request.batch)
                        elif isinstance(record, SnapshotRecord):
                            applied = self._stage_snapshot(cursor, record, bodies[id(record)], state, request)
                        else:
                            applied = self._stage_tool_effect(record, state, request.batch)
                        suppressed += not applied
                    except Malformed as error:
                        refusals.append(Refusal(record.lineage.index, error.code, str(error)))
                sequence = None
                if request.batch:
                    sequence = self._wal.append(request.batch.encode())
                    self._stored.logged(request.staged)
                    self._applier.submit(sequence, request.batch, request.staged)
                self.states.touch(touched, sequence)
            except BaseException as error:
                # Nothing of this request is durable, but its runs' state may already count part of
                # it: load that state again once everything logged before it is applied.
                for run_id in touched:
                    self.states.drop(run_id)
                    self._stale_runs[run_id] = self._wal.last_sequence
                self.fragments.clear()
                if isinstance(error, OSError):
                    raise StoreUnavailable(f"the recorder cannot write its log now: {error}") from error
                raise
            finally:
                cursor.close()
            self.states.forget_idle(self._applier.applied, keep=touched)
            return refusals, suppressed

    def log_rows(self, refs: Sequence[bytes], bodies: Sequence[str], rows: dict[str, dict[str, object]]) -> int:
        """Log one entry of `rows` (table -> columns; each row gets the next `write_seq`) and the messages `refs`
        names that the store lacks, their JSON taken from `bodies`; returns its log sequence.

        The messages go into the same content-addressed store as snapshots': one a run recorded already costs
        its reference. Raises Malformed when `refs` names a message neither stored nor in `bodies`, or a body
        is not a JSON object; StoreUnavailable when the log cannot be written.
        """
        given = {hashlib.sha256(text.encode()).digest(): text for text in bodies}
        with self.lock:
            cursor = CursorOnDemand(self._connection)
            try:
                request = _Request(self._stored.lookup(cursor, set(refs)))
                new = {digest: given.get(digest) for digest in refs if not request.holds(digest)}
                if unknown := [digest for digest, text in new.items() if text is None]:
                    raise Malformed(
                        "unknown_message", f"{len(unknown)} message(s) are neither stored nor sent, the first"
                        f" {unknown[0].hex()}"
                    )  # fmt: skip
                for position, text in enumerate(new.values()):
                    check_message_json(text, position)
                for digest, text in new.items():
                    self._stage_message(request, digest, text, len(text.encode()))
                for table, columns in rows.items():
                    request.batch.add(table, **columns, write_seq=self._seq())
                try:
                    sequence = self._wal.append(request.batch.encode())
                except OSError as error:
                    raise StoreUnavailable(f"the recorder cannot write its log now: {error}") from error
                self._stored.logged(request.staged)
                self._applier.submit(sequence, request.batch, request.staged)
                return sequence
            finally:
                cursor.close()

    def _forget_stale_states(self, run_ids: set[str]) -> None:
        """Drop the state of runs a failed write or a set-aside request left wrong, or refuse while it
        cannot be loaded again yet (earlier requests are still to be applied)."""
        for run_id in self._applier.take_set_aside_runs():
            self._stale_runs[run_id] = self._wal.last_sequence
        for run_id in run_ids & self._stale_runs.keys():
            if self._applier.applied < self._stale_runs[run_id]:
                raise StoreUnavailable(
                    self._applier.stalled or f"run {run_id!r} waits for its earlier records to be applied"
                )
            del self._stale_runs[run_id]
            self.states.drop(run_id)

    def _hold(self, records: list[StepRecord]) -> None:
        """In a lake, hold the runs this request brings that ingest keeps no state of, claiming the registrations
        it carries in the same statement (`lake.handoff`); raises StoreUnavailable while one waits for another
        recorder's log."""
        if self._handoff is None:
            return
        absent: dict[str, str | None] = {}
        for record in records:
            run_id = record.lineage.run_id
            if self.states.get(run_id) is None:
                registration = record.registration_id if isinstance(record, StepEventRecord) else None
                absent[run_id] = absent.get(run_id) or registration
        self._holding = self._handoff.hold(absent) if absent else Holding({}, set())

    def let_go(self, run_ids: set[str]) -> int:
        """Forget runs another lake recorder took (their next records here load them again, after its log);
        answers the log's last sequence, everything before which is acknowledged."""
        with self.lock:
            for run_id in run_ids:
                self.states.drop(run_id)
                self._stale_runs[run_id] = self._wal.last_sequence
            return self._wal.last_sequence

    def _state(self, cursor: duckdb.DuckDBPyConnection, run_id: str, *, moved_here: bool = False) -> RunState:
        """What ingest knows of a run: kept in memory once seen, else loaded from the database.

        A run the run-id filter has never seen starts empty with no query at all: with 100,000
        short runs, four lookups per new run were most of the ingest time (docs/benchmarks.md).
        A run another lake recorder wrote until now (`moved_here`) is loaded whatever the filter says.
        """
        if (state := self.states.get(run_id)) is not None:
            return state
        key = run_key(run_id)
        if not moved_here and not self.run_ids.might_contain(key):
            self.run_ids.add(key)
            state = RunState(max_snapshots=self._default_max_snapshots)
            self.states.add(run_id, state)
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
            state.last_refs = wire.split_digests(rebuild_refs(cursor, run_id, state.last_index))
            state.known_digests = set(state.last_refs)
            depth = 0
            for _, _, base, *_ in reversed(snapshots):
                if base is None:
                    break
                depth += 1
            state.chain_depth = depth
        if moved_here:  # this host's clock may be behind the last one's: the run's rows stay in write order
            (last,) = cursor.execute(
                "SELECT coalesce(max(write_seq), 0) FROM (SELECT write_seq FROM events WHERE run_id = $1"
                " UNION ALL SELECT write_seq FROM snapshots WHERE run_id = $1"
                " UNION ALL SELECT write_seq FROM tool_effects WHERE run_id = $1)", [run_id],
            ).fetchone()  # fmt: skip
            self._seq.advance_past(last)
        self.states.add(run_id, state)
        return state

    def _stage_event(self, record: StepEventRecord, state: RunState, batch: Batch) -> bool:
        lineage = record.lineage
        if record.kind == "run_started":
            if state.registration_id is not None and state.registration_id != record.registration_id:
                raise _run_id_taken(lineage.run_id)
            if state.registration_id is None:
                self._claim(lineage.run_id, record.registration_id)
                state.registration_id = record.registration_id
                state.run_seq = self._seq()
                if record.max_snapshots is not None:
                    state.max_snapshots = record.max_snapshots
                batch.add(
                    "runs",
                    **_lineage_columns(record),
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
            **_lineage_columns(record),
            write_seq=write_seq,
            kind=record.kind,
            tool_call_id=record.tool_call_id,
            tool_name=record.tool_name,
            error=record.error,
            metadata=list(record.metadata.items()),
        )
        return True

    def _claim(self, run_id: str, registration_id: str) -> None:
        """Claim the run id among the lake's recorders: another recorder may have registered it moments ago, which
        neither this recorder's state nor the lake shows yet. Usually claimed already, with the request's runs."""
        if self._handoff is None:
            return
        holder = self._holding.registrations.get(run_id)
        if holder is None:
            holder = self._handoff.hold({run_id: registration_id}).registrations[run_id]
        if holder != registration_id:
            raise _run_id_taken(run_id)

    def _stage_message(self, request: _Request, digest: bytes, text: str, size: int) -> None:
        """Store a new message once, its media as blobs, and which blobs it refers to."""
        body, offloaded = self._media.externalize(text)
        request.batch.add("messages", digest=digest, body=body, size_bytes=size)
        self._bodies.put(digest, body)
        for uri, blob_bytes in offloaded:
            request.batch.add("media_refs", digest=digest, uri=uri, size_bytes=blob_bytes)
        request.staged.add(digest)
        self._stored.staged(digest)

    def _stage_fragment(
        self, cursor: duckdb.DuckDBPyConnection, record: MessageFragmentRecord, request: _Request
    ) -> bool:
        """Keep a piece of a large message; when the last piece is in, store the message whole."""
        digest = record.digest
        if request.holds(digest):
            return False
        parts = self.fragments.get(digest)
        if parts is None:
            self._wait_all_applied()  # pieces from before a restart are in the table
            rows = cursor.execute(
                "SELECT fragment_index, data FROM message_fragments WHERE digest = ?", [digest]
            ).fetchall()
            parts = self.fragments[digest] = {index: bytes(data) for index, data in rows}
        if record.index in parts:
            return False
        if any(index >= record.count for index in parts):
            raise Malformed(
                "bad_attribute", f"fragment count {record.count} disagrees with pieces of this message held"
            )
        self._make_room_for_assembly(digest, len(record.data))
        parts[record.index] = record.data
        request.batch.add("message_fragments", digest=digest, fragment_index=record.index,
                          fragment_count=record.count, data=record.data)  # fmt: skip
        if any(index not in parts for index in range(record.count)):
            return True
        whole = b"".join(parts[i] for i in range(record.count))
        del self.fragments[digest]
        if hashlib.sha256(whole).digest() != digest:
            raise Malformed("bad_body", "the fragments of a message do not add up to its digest")
        self._stage_message(request, digest, _json_object_text(whole), len(whole))
        request.batch.assembled.append(digest)
        return True

    def _make_room_for_assembly(self, digest: bytes, size: int) -> None:
        """Forget the oldest other unfinished messages until `size` more bytes fit under MAX_ASSEMBLY_BYTES.

        Their pieces are logged, so one that resumes is loaded again from the table; a sender that
        abandons large messages can therefore not lock others out until a restart.
        """
        held = {d: sum(map(len, pieces.values())) for d, pieces in self.fragments.items()}
        if held[digest] + size > MAX_ASSEMBLY_BYTES:
            raise Malformed("too_large", f"a message of more than {MAX_ASSEMBLY_BYTES} bytes")
        total = sum(held.values())
        for other in [d for d in self.fragments if d != digest]:
            if total + size <= MAX_ASSEMBLY_BYTES:
                break
            total -= held[other]
            del self.fragments[other]

    def _stage_tool_effect(self, record: ToolEffectRecord, state: RunState, batch: Batch) -> bool:
        key = record.lineage.idempotency_key
        if key is not None and not state.add_effect_key(key):
            return False
        columns = _lineage_columns(record)
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
        self, cursor: duckdb.DuckDBPyConnection, record: SnapshotRecord, bodies: Bodies, state: RunState,
        request: _Request,
    ) -> bool:  # fmt: skip
        key = record.lineage.idempotency_key
        if key is not None and state.seen_snapshot_key(key):
            return False
        if record.base_index is None:
            base: tuple[bytes, ...] = ()
        elif record.base_index == state.last_index:
            base = state.last_refs
        else:
            self._wait_all_applied()  # the base may still be in the log
            base = wire.split_digests(rebuild_refs(cursor, record.lineage.run_id, record.base_index))
            if not base and record.keep:
                raise Malformed("unknown_base", f"snapshot base {record.base_index} of this run was never stored")
        if record.keep > len(base):
            raise Malformed("bad_attribute", f"keep {record.keep} exceeds the {len(base)} messages of its base")
        refs = base[: record.keep] + record.append_refs
        unknown = [
            r for r in record.append_refs if r not in state.known_digests and r not in bodies and not request.holds(r)
        ]
        if unknown:
            raise Malformed(
                "unknown_message", f"snapshot references {len(unknown)} message(s) the recorder never received"
            )
        new = [(digest, body) for digest, body in bodies.items() if digest not in state.known_digests
               and not request.holds(digest)]  # fmt: skip
        for _, (text, _, position) in new:  # all checked before any is staged: a refused snapshot stores none
            check_message_json(text, position)
        for digest, (text, size, _) in new:
            self._stage_message(request, digest, text, size)
        # A run under retention stores whole reference lists: pruning then never breaks a chain.
        store_full = record.base_index is None or state.chain_depth + 1 >= FULL_REFS_EVERY or bool(state.max_snapshots)
        write_seq = self._seq()
        request.batch.add(
            "snapshots",
            **_lineage_columns(record),
            write_seq=write_seq,
            snapshot_index=record.snapshot_index,
            state=record.state,
            base_index=None if store_full else record.base_index,
            keep=0 if store_full else record.keep,
            refs=b"".join(refs if store_full else record.append_refs),
            message_count=len(refs),
        )
        request.batch.pruned.extend(state.retain(write_seq, record.state, key))
        # The base's references are known already when it is the run's last snapshot: adding them again made a
        # run's snapshots cost the square of its length.
        state.known_digests.update(record.append_refs if base is state.last_refs else refs)
        state.last_index, state.last_refs = record.snapshot_index, refs
        state.chain_depth = 0 if store_full else state.chain_depth + 1
        return True


def _run_id_taken(run_id: str) -> Malformed:
    return Malformed(
        wire.REFUSED_RUN_ID_TAKEN,
        f"run_id {run_id!r} is already registered by another Agent.run; run ids are single-use",
    )


def _carried(records: list[StepRecord], bodies: dict[int, Bodies]) -> set[bytes]:
    """Every message a request refers to or carries: what "is it stored?" is asked of, once."""
    carried: set[bytes] = set()
    for record in records:
        if isinstance(record, SnapshotRecord):
            carried.update(record.append_refs)
            carried.update(bodies[id(record)])
        elif isinstance(record, MessageFragmentRecord):
            carried.add(record.digest)
    return carried
