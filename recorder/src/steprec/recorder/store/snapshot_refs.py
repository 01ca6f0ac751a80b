"""A snapshot's reference list, stored as a delta on an earlier snapshot of its run and rebuilt from the chain."""

from __future__ import annotations

import duckdb
from steprec.proto import wire

FULL_REFS_EVERY = 32
"""A snapshot stores its whole reference list after this many deltas, bounding the chain a read walks."""


def rebuild_refs(
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
