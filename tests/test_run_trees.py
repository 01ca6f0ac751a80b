"""Run trees read from the ancestry kept at ingest (recorder/tree.py), checked against the walk over the links.

Every test sends `run_started` records straight over OTLP/gRPC to a real recorder, in orders agents in
different processes produce (children before their parents, parents that never come), and reads the trees
back through RecorderClient. The oracle is the recursive walk the recorder used before the ancestry existed,
run here through the read-only SQL path over the `runs` view.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import duckdb
import grpc
import pytest
from steprec.proto import wire
from steprec.proto.query.v1 import query_pb2 as pb
from steprec.proto.query.v1 import query_pb2_grpc
from steprec.query import SyncRecorderClient
from steprec.recorder.daemon.process import RecorderProcess
from steprec.recorder.querier.sql import QueryLimits, SqlTimeout
from steprec.recorder.store.duckdb_store import DuckDBStore
from steprec.recorder.store.tree import HOP_LIMIT

from .test_hostile_ingest import export, int_value, log_record, request_bytes, string_value
from .test_store import _event, drop_columns

STEPREC = str(Path(sys.executable).parent / "steprec")
BASE_NS = 1_767_225_600 * 10**9

WALK = """
    WITH RECURSIVE edges AS (
        SELECT parent_run_id AS from_run_id, run_id FROM runs WHERE parent_run_id IS NOT NULL
        UNION ALL SELECT forked_from_run_id, run_id FROM runs WHERE forked_from_run_id IS NOT NULL
    ), tree(run_id, depth) USING KEY (run_id) AS (
        SELECT '{run_id}'::VARCHAR, 0
        UNION
        SELECT found.run_id, found.depth
        FROM (SELECT e.run_id, t.depth + 1 FROM tree t JOIN edges e ON e.from_run_id = t.run_id) found(run_id, depth)
        WHERE found.depth <= 10000 AND found.run_id NOT IN (SELECT run_id FROM recurring.tree)
    )
    SELECT t.run_id, t.depth FROM tree t JOIN runs r ON r.run_id = t.run_id ORDER BY t.depth, r.started_at
"""
"""The breadth-first walk over parent and fork links, each run at its least depth (the recorder's read before)."""


def run_started(run_id: str, parent: str | None = None, fork_of: str | None = None, *, at: int = 0,
                conversation: str | None = None):  # fmt: skip
    """A `run_started` record registering `run_id` under `parent` and/or as a fork of `fork_of`."""
    links = {wire.PARENT_RUN_ID: parent, wire.FORKED_FROM_RUN_ID: fork_of, wire.CONVERSATION_ID: conversation}
    attrs = {wire.RUN_ID: run_id, wire.REGISTRATION_ID: run_id, **{k: v for k, v in links.items() if v}}
    fields = {wire.STEP_INDEX: int_value(0), **{k: string_value(v) for k, v in attrs.items()}}
    return log_record(wire.EVENT_PREFIX + "run_started", fields, time_unix_nano=BASE_NS + at * 1_000_000)


class Target:
    """A recorder over a data folder, restartable, with an OTLP channel and a query client."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.process = RecorderProcess(folder).start()
        self._open()

    def _open(self) -> None:
        self.channel = grpc.insecure_channel(self.process.endpoint)
        self.client = SyncRecorderClient(self.process.endpoint)
        self.client.__enter__()

    def close(self) -> None:
        self.client.__exit__(None, None, None)
        self.channel.close()
        self.process.stop()

    def restart(self) -> None:
        self.close()
        self.process = RecorderProcess(self.folder).start()
        self._open()

    def send(self, *records) -> None:
        answer, response = export(self.channel, request_bytes(*records))
        assert answer.problem is None and not response.partial_success.rejected_log_records, answer

    def walk(self, run_id: str) -> list[tuple[str, int]]:
        table = self.client.sql(WALK.format(run_id=run_id), max_rows=100_000, timeout_seconds=60)
        return list(zip(table["run_id"].to_pylist(), table["depth"].to_pylist(), strict=True))

    def descendants(self, run_id: str) -> list[tuple[str, int]]:
        table = self.client.descendants(run_id)
        return [] if table is None else list(zip(table["run_id"].to_pylist(), table["depth"].to_pylist(), strict=True))

    def run_tree(self, run_id: str) -> list[tuple[str, int]]:
        """GetRunTree's rows (RecorderClient.run_tree hangs them into objects)."""
        stub = query_pb2_grpc.RecorderQueryStub(self.channel)
        try:
            pages = list(stub.GetRunTree(pb.GetRunTreeRequest(run_id=run_id), timeout=60))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND, error
            return []
        return [(entry.run.run_id, entry.depth) for page in pages for entry in page.runs]

    def assert_same_as_walk(self, run_ids) -> None:
        for run_id in run_ids:
            walked = self.walk(run_id)
            assert self.descendants(run_id) == walked, run_id
            assert self.run_tree(run_id) == walked, run_id


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Target]:
    target = Target(tmp_path / "recorder")
    try:
        yield target
    finally:
        target.close()


def test_children_recorded_before_their_parents_join_the_tree_when_the_parents_arrive(target: Target) -> None:
    # Grandchildren first, then their parents, then the root: each in its own request (its own batch).
    target.send(run_started("gc-1", "c-1", at=5), run_started("gc-2", "c-1", at=6), run_started("gc-3", "c-2", at=7))
    assert target.descendants("c-1") == []  # a parent not yet recorded is no run
    target.send(run_started("c-1", "root", at=2), run_started("c-2", "root", at=3))
    assert target.descendants("c-1") == [("c-1", 0), ("gc-1", 1), ("gc-2", 1)]
    assert target.descendants("root") == []
    target.send(run_started("root", at=1))
    expected = [("root", 0), ("c-1", 1), ("c-2", 1), ("gc-1", 2), ("gc-2", 2), ("gc-3", 2)]
    assert target.descendants("root") == expected
    assert [run.run_id for run in target.client.ancestors("gc-3")] == ["c-2", "root"]
    tree = target.client.run_tree("root")
    assert [child.run.run_id for child in tree.children] == ["c-1", "c-2"]
    assert [g.run.run_id for g in tree.children[0].children] == ["gc-1", "gc-2"]
    # A late parent above a chain deeper than one ancestry lookup reaches: every level comes in its own batch.
    chain = [f"deep-{i}" for i in range(2 * HOP_LIMIT + 5)]
    for i in reversed(range(1, len(chain))):
        target.send(run_started(chain[i], chain[i - 1], at=100 + i))
    target.send(run_started(chain[0], "gc-3", at=100))
    assert target.descendants("root")[-1] == (chain[-1], 2 + len(chain))
    target.assert_same_as_walk(["root", "c-2", chain[0], chain[HOP_LIMIT], chain[-1]])


def test_forks_and_runs_that_are_both_delegate_and_fork_take_their_least_depth(target: Target) -> None:
    target.send(
        run_started("fork-of-b", fork_of="b", at=9),  # before its origin
        run_started("a", at=1),
        run_started("b", "a", at=2),
        run_started("c", "b", at=3),
        run_started("both", "c", "a", at=4),  # a delegate of c, forked from a: depth 1 below a
        run_started("d", "both", at=5),
    )
    assert target.descendants("a") == [("a", 0), ("b", 1), ("both", 1), ("c", 2), ("d", 2), ("fork-of-b", 2)]
    assert target.descendants("c") == [("c", 0), ("both", 1), ("d", 2)]
    relations = target.client.sql("SELECT run_id, depth, relation FROM run_tree WHERE root_run_id = 'a' ORDER BY ALL")
    assert ("fork-of-b", 2, "fork") in [tuple(row.values()) for row in relations.to_pylist()]
    target.assert_same_as_walk(["a", "b", "c", "both", "fork-of-b"])


def test_parent_links_in_a_ring_longer_than_one_lookup_end(target: Target) -> None:
    ring = [f"ring-{i}" for i in range(HOP_LIMIT * 3 + 1)]
    # Half the ring in one request, the rest one run per request: rounds within a batch and across batches.
    half = len(ring) // 2
    target.send(*[run_started(ring[i], ring[i - 1], at=i) for i in range(half)])
    for i in range(half, len(ring)):
        target.send(run_started(ring[i], ring[i - 1], at=i))
    got = target.descendants(ring[0])
    assert got == [(run_id, depth) for depth, run_id in enumerate(ring)]
    target.assert_same_as_walk([ring[0], ring[HOP_LIMIT], ring[-1]])


def test_pruned_runs_leave_the_trees_they_were_in_as_the_walk_did(target: Target) -> None:
    target.send(
        run_started("p-root", at=1, conversation="keep"),
        run_started("p-mid", "p-root", at=2, conversation="old"),
        run_started("p-leaf", "p-mid", at=3, conversation="keep"),
        run_started("p-fork", fork_of="p-leaf", at=4, conversation="keep"),
        run_started("p-side", "p-root", "p-leaf", at=5, conversation="keep"),
    )
    assert len(target.descendants("p-root")) == 5
    result = subprocess.run([STEPREC, "prune", "--endpoint", target.process.endpoint, "--conversation", "old"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    # p-leaf's parent is gone: p-root reaches only its own delegate p-side, and p-mid names what is under it still.
    assert target.descendants("p-root") == [("p-root", 0), ("p-side", 1)]
    assert target.descendants("p-leaf") == [("p-leaf", 0), ("p-fork", 1), ("p-side", 1)]
    assert target.walk("p-mid") == [("p-leaf", 1), ("p-fork", 2), ("p-side", 2)]
    assert target.client.descendants("p-mid") is None
    target.assert_same_as_walk(["p-root", "p-leaf", "p-side"])
    # The pruned run registers again (a new run, same id): it joins the tree once more.
    target.send(run_started("p-mid", "p-side", at=6, conversation="again"))
    target.assert_same_as_walk(["p-root", "p-leaf", "p-mid", "p-side"])


def test_a_random_forest_sent_in_any_order_reads_as_the_walk_before_and_after_a_restart(target: Target) -> None:
    rng = random.Random(5)
    names = [f"f-{i}" for i in range(150)] + [f"ghost-{i}" for i in range(5)]  # ghosts are never recorded

    def linked() -> str | None:
        return rng.choice(names) if rng.random() < 0.75 else None

    records = [run_started(f"f-{i}", linked(), linked() if rng.random() < 0.3 else None, at=i) for i in range(150)]
    rng.shuffle(records)
    while records:
        size = rng.choice([1, 1, 3, 10, 40])
        target.send(*records[:size])
        records = records[size:]
    registered = [f"f-{i}" for i in range(150)]
    target.assert_same_as_walk(registered)
    target.restart()
    target.assert_same_as_walk(registered)


def _run_started_event(run_id: str, parent: str | None):
    """A decoded `run_started` record, for a store opened in this process."""
    event = _event("run_started", None, run_id=run_id, registration=run_id)
    return replace(event, lineage=replace(event.lineage, parent_run_id=parent))


def test_a_store_from_before_the_ancestry_gains_it_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "steprec.duckdb"
    store = DuckDBStore(path)
    store.ingest([_run_started_event("up", None), _run_started_event("down", "up"), _run_started_event("x", "down")])
    store.close()
    # Make it the file a schema-2 recorder left: no run_ancestry table, version 2 recorded last.
    old = duckdb.connect(str(path))
    old.execute("DROP TABLE run_ancestry")
    old.execute("DROP TABLE conversations")
    old.execute("DROP TABLE conversation_heads")
    drop_columns(old, "run_endings", "run_seq")
    drop_columns(old, "runs", "ended_at", "end_kind")
    old.execute("DELETE FROM steprec_schema WHERE version >= 3")
    old.close()
    store = DuckDBStore(path)
    try:
        assert [(r["run_id"], r["depth"]) for r in store.run_tree("up", ancestors=False)] == [
            ("up", 0), ("down", 1), ("x", 2)
        ]  # fmt: skip
    finally:
        store.close()


def test_tree_reads_stop_at_their_time_limit(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "steprec.duckdb")
    try:
        chain = [f"t-{i}" for i in range(3000)]
        store.ingest([_run_started_event(run_id, chain[i - 1] if i else None) for i, run_id in enumerate(chain)])
        assert len(store.run_tree("t-0", ancestors=False, timeout_seconds=60)) == 3000
        with pytest.raises(SqlTimeout, match="time limit"):
            store.run_tree("t-0", ancestors=False, timeout_seconds=0.001)
        limited = store.descendants("t-0", QueryLimits(max_rows=None, timeout_seconds=0.001))
        with pytest.raises(SqlTimeout, match="time limit"):
            b"".join(limited)
        limited.close()
    finally:
        store.close()
