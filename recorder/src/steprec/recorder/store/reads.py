"""The reads: runs, trees, events, snapshots and their messages, media, SQL; each sees every acknowledged record.

Every read first waits until everything acknowledged before it is applied (`Applier.wait_applied`,
through `cursor()`), so a reader never misses a record whose Export was answered. A snapshot's
reference list is rebuilt from its delta chain once and kept (`SNAPSHOT_CACHE_BYTES`); which row
a read picks is kept too (`SnapshotChoices`), until the applier commits a change to that run's
snapshots; message bodies come from the message cache before DuckDB.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Sequence

import duckdb
import pyarrow as pa
from steprec.proto import wire
from steprec.proto.sized_cache import SizedCache

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
)
from .applier import Applier
from .connection import dicts
from .media import URI_PREFIX, MediaCodec, MediaCorrupt
from .snapshot_choices import SnapshotChoices
from .snapshot_refs import rebuild_refs
from .tree import deeper_descendants

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


class Reads:
    """Every read of the store, over one DuckDB connection."""

    def __init__(
        self,
        connection: duckdb.DuckDBPyConnection,
        applier: Applier,
        last_sequence: Callable[[], int],
        media: MediaCodec,
        bodies: SizedCache[bytes, str],
        choices: SnapshotChoices,
    ) -> None:
        self._connection = connection
        self._applier = applier
        self._last_sequence = last_sequence
        self._media = media
        self._bodies = bodies
        self._choices = choices
        self._snapshots = SizedCache[tuple[str, int], tuple[dict, bytes]](SNAPSHOT_CACHE_BYTES, size=_snapshot_size)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A read cursor that sees every record acknowledged before this call (all that is applied, while stalled)."""
        self._applier.wait_applied(self._last_sequence(), for_write=False)
        return self._connection.cursor()

    def list_snapshots(self, run_id: str, *, include_interrupted: bool) -> list[dict]:
        """The run's retained snapshots in write order, without their messages."""
        where, params = _snapshot_filter(run_id, include_interrupted=include_interrupted)
        with self.cursor() as cursor:
            return dicts(
                cursor.execute(f"SELECT {_SNAPSHOT_INFO} FROM snapshots WHERE {where} ORDER BY write_seq", params)
            )

    def read_snapshot(
        self, run_id: str, *, include_interrupted: bool, snapshot_index: int | None = None, digests_only: bool = False
    ) -> tuple[dict, list[str] | bytes] | None:
        """The newest snapshot (by write order), or the given retained one, and its messages' JSON (or, with
        `digests_only`, their digests concatenated); or None."""
        where, params = _snapshot_filter(run_id, include_interrupted=include_interrupted, snapshot_index=snapshot_index)
        with self.cursor() as cursor:
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

    def kept_snapshot(
        self, run_id: str, *, include_interrupted: bool, snapshot_index: int | None = None
    ) -> tuple[dict, bytes] | None:
        """What `read_snapshot(..., digests_only=True)` answers, when that needs neither DuckDB nor a wait for the
        applier (the answer is kept and everything acknowledged is applied); else None. Safe on an event loop."""
        if not self._applier.all_applied():
            return None
        write_seq = self._choices.kept((run_id, include_interrupted, snapshot_index))
        return None if write_seq is None else self._snapshots.get((run_id, write_seq))

    def _snapshot(self, cursor: duckdb.DuckDBPyConnection, run_id: str, write_seq: int) -> tuple[dict, bytes]:
        """A snapshot row's info and whole reference list, built once and then kept (`_snapshots`): a written
        snapshot row never changes, and bounding its chain by the row's write sequence keeps later rows from
        changing what it rebuilds to. Which row to read is kept apart (`_choices`), until its run's snapshots change."""
        key = (run_id, write_seq)
        if (cached := self._snapshots.get(key)) is None:
            (info,) = dicts(
                cursor.execute(
                    f"SELECT {_SNAPSHOT_INFO} FROM snapshots WHERE run_id = ? AND write_seq = ?", [run_id, write_seq]
                )
            )
            cached = info, rebuild_refs(cursor, run_id, info["snapshot_index"], write_seq)
            self._snapshots.put(key, cached)
        return cached

    def read_messages(self, digests: Sequence[bytes]) -> list[str]:
        """Stored messages by digest, in the order asked, media restored.

        Raises `LookupError` naming the first digest no stored message has.
        """
        with self.cursor() as cursor:
            return self._messages(cursor, digests)

    def _messages(
        self, cursor: duckdb.DuckDBPyConnection, digests: Sequence[bytes], *, restore: bool = True
    ) -> list[str]:
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
        if not restore:
            return [bodies[d] for d in digests]
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
        equal = {"run_id": run_id, "conversation_id": conversation_id, "parent_run_id": parent_run_id,
                 "agent_name": agent_name, "forked_from_run_id": forked_from_run_id}  # fmt: skip
        filters, params = run_filters(equal, started_at_or_after_ns, started_before_ns, after=after)
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
            return dicts(
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
        with self.cursor() as cursor:
            known = cursor.execute("SELECT 1 FROM media_refs WHERE uri = ? LIMIT 1", [uri]).fetchone()
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
        with self.cursor() as cursor:
            return dicts(
                cursor.execute(
                    "SELECT run_id, kind, step_index, epoch_ns(recorded_at) AS at_ns, conversation_id, parent_run_id,"
                    " agent_name, tool_call_id, tool_name, error, metadata, idempotency_key, trace_id, span_id"
                    " FROM events WHERE run_id = ? ORDER BY write_seq",
                    [run_id],
                )
            )

    def list_tool_effects(self, run_id: str, *, unresolved_only: bool, tool_call_id: str | None = None) -> list[dict]:
        """The run's ledger (the `tool_effects` view): per call the latest status, annotations kept."""
        with self.cursor() as cursor:
            return dicts(
                cursor.execute(
                    "SELECT run_id, tool_call_id, tool_name, status, epoch_ns(started_at) AS started_at_ns,"
                    " epoch_ns(ended_at) AS ended_at_ns, idempotency_key, effect_summary FROM recorded.tool_effects"
                    " WHERE run_id = ? AND (?::VARCHAR IS NULL OR tool_call_id = ?) AND (NOT ? OR status = 'started')"
                    " ORDER BY seq",
                    [run_id, tool_call_id, tool_call_id, unresolved_only],
                )
            )


def run_filters(
    equal: dict[str, str | None],
    started_at_or_after_ns: int | None = None,
    started_before_ns: int | None = None,
    *,
    after: tuple[int, int] | None = None,
    before: tuple[int, int] | None = None,
) -> tuple[list[str], list]:
    """SQL conditions on `runs r` and their parameters: columns equal to the values given (None: any), a start
    range, and a page's bound, runs after (or before) a `(started_at_ns, write_seq)`."""
    filters, params = [], []
    for column, value in equal.items():
        if value is not None:
            filters.append(f"r.{column} = ?")
            params.append(value)
    if started_at_or_after_ns is not None:
        filters.append("epoch_ns(r.started_at) >= ?")
        params.append(started_at_or_after_ns)
    if started_before_ns is not None:
        filters.append("epoch_ns(r.started_at) < ?")
        params.append(started_before_ns)
    for bound, beyond in ((after, ">"), (before, "<")):
        if bound is not None:
            filters.append(
                f"(epoch_ns(r.started_at) {beyond} ? OR (epoch_ns(r.started_at) = ? AND r.write_seq {beyond} ?))"
            )
            params.extend([bound[0], bound[0], bound[1]])
    return filters, params


def _deeper_registration(run_id: str):
    """What a descendants read registers first: its descendants beyond one ancestry lookup, as `deeper`."""

    def register(cursor: duckdb.DuckDBPyConnection) -> None:
        cursor.register("deeper", deeper_descendants(cursor, run_id))

    return register
