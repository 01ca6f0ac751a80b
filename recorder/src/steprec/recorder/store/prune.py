"""Prune: whole runs out (their events, snapshots and tool effects), then the messages and media no one refers to."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import pyarrow as pa
from steprec.proto import wire

from .conversations import remove_head
from .media import MediaStore
from .tree import unlink


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


def prune_runs(
    cursor: duckdb.DuckDBPyConnection,
    media: MediaStore,
    *,
    started_before_ns: int | None,
    conversation_id: str | None,
    dry_run: bool,
    on_committed: Callable[[list[str]], None],
    head_revision: int | None = None,
    collect_messages: bool = True,
) -> PruneResult:
    """Remove the matching runs and what only they referred to, in one transaction (rolled back when `dry_run`).

    With `head_revision`, the conversation's head goes too, if its revision is still that one
    (`conversations.remove_head`: Conflict otherwise, and nothing is removed).

    The caller holds the write path's lock and has waited until everything acknowledged is
    applied, so prune never races a write it cannot see. `on_committed` runs right after the
    commit (given the pruned run ids), before the media are collected: it drops what ingest and the
    reads remember of the store, before a read could pick a row that is gone.

    Without `collect_messages` (a lake), messages and media stay: another recorder may be about to
    refer to one it knows is stored, in a commit this transaction cannot see.
    """
    filters, params = [], []
    if started_before_ns is not None:
        filters.append("epoch_ns(started_at) < ?")
        params.append(started_before_ns)
    if conversation_id is not None:
        filters.append("conversation_id = ?")
        params.append(conversation_id)
    try:
        cursor.execute("BEGIN")
        if head_revision is not None:
            remove_head(cursor, conversation_id, head_revision)
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
        messages = message_bytes = 0
        if collect_messages:
            messages, message_bytes, blobs_in_use = _collect_messages(cursor)
        cursor.execute("ROLLBACK" if dry_run else "COMMIT")
        if not dry_run:
            on_committed(pruned.column("run_id").to_pylist())
    except BaseException:
        with contextlib.suppress(duckdb.TransactionException):  # a failed COMMIT already ended it
            cursor.execute("ROLLBACK")
        raise
    media_blobs, media_bytes = (0, 0) if dry_run or not collect_messages else media.collect_garbage(blobs_in_use)
    return PruneResult(
        runs=counts["runs"], events=counts["events"], snapshots=counts["snapshots"],
        tool_effects=counts["tool_effects"], messages=messages, message_bytes=message_bytes,
        media_blobs=media_blobs, media_bytes=media_bytes,
    )  # fmt: skip


def _collect_messages(cursor: duckdb.DuckDBPyConnection) -> tuple[int, int, set[str]]:
    """Delete the messages nothing retained refers to: their count and bytes, and the media blobs still in use."""
    referenced = pa.table({"digest": pa.array(list(_referenced_digests(cursor)), pa.binary())})
    cursor.register("referenced", referenced)
    messages, message_bytes = cursor.execute(
        "SELECT count(*), coalesce(sum(size_bytes), 0) FROM messages ANTI JOIN referenced USING (digest)"
    ).fetchone()
    cursor.execute("DELETE FROM messages WHERE digest NOT IN (SELECT digest FROM referenced)")
    cursor.unregister("referenced")
    cursor.execute("DELETE FROM media_refs WHERE digest NOT IN (SELECT digest FROM messages)")
    blobs_in_use = {uri for (uri,) in cursor.execute("SELECT DISTINCT uri FROM media_refs").fetchall()}
    return messages, message_bytes, blobs_in_use


def _referenced_digests(cursor: duckdb.DuckDBPyConnection) -> set[bytes]:
    """Every digest a retained snapshot or a conversation head refers to: the union of all stored reference lists
    and deltas."""
    referenced: set[bytes] = set()
    for table in ("snapshots WHERE NOT pruned", "conversation_heads"):
        for batch in cursor.execute(f"SELECT refs FROM {table}").to_arrow_reader():
            for blob in batch.column(0).to_pylist():
                referenced.update(wire.split_digests(blob))
    return referenced
