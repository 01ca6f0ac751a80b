"""Storage writes: what one ingest transaction stores, suppresses and refuses, in a real DuckDB file."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from steprec.recorder.ingest.decode import Lineage, SnapshotRecord, StepEventRecord, ToolEffectRecord
from steprec.recorder.store import write_path as write_path_module
from steprec.recorder.store.duckdb_store import DuckDBStore


def _lineage(run_id: str = "run-1", key: str | None = None, index: int = 0, step: int = 0) -> Lineage:
    return Lineage(index, run_id, step, 1_700_000_000_000_000_000 + index, "conv", None, "agent", key, None, None)


def _event(kind: str, key: str | None, run_id: str = "run-1", registration: str | None = None, index: int = 0):
    return StepEventRecord(_lineage(run_id, key, index), kind, None, None, None, {"k": "v"}, registration, None)


def _message(n: int) -> str:
    return f'{{"kind":"request","parts":[{{"part_kind":"user-prompt","content":"m{n}"}}]}}'


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _snapshot(index: int, messages: list[str], *, base: int | None, keep: int, send: list[str], state="complete"):
    appended = tuple(_digest(m) for m in messages[keep:])
    return SnapshotRecord(
        _lineage(key=f"{index}:{index}:{state}", index=index), index, state, base, keep, appended, send
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DuckDBStore]:
    opened = DuckDBStore(tmp_path / "steprec.duckdb")
    yield opened
    opened.close()


def test_database_file_is_owner_only(store: DuckDBStore) -> None:
    assert store.path.stat().st_mode & 0o077 == 0


def test_keyed_events_are_suppressed_per_run_and_unkeyed_ones_append(store: DuckDBStore) -> None:
    refusals, suppressed = store.ingest(
        [
            _event("run_started", "0:0:run_started:", registration="reg"),
            _event("run_started", "0:0:run_started:", registration="reg"),  # retried registration
            _event("model_request_started", None),
            _event("model_request_started", None),
            _event("run_started", "0:0:run_started:", run_id="run-2", registration="reg-2"),
        ]
    )
    assert refusals == [] and suppressed == 1
    assert [e["kind"] for e in store.list_events("run-1")] == ["run_started"] + ["model_request_started"] * 2
    assert len(store.list_events("run-2")) == 1
    assert store.get_run("run-1")["metadata"] == {"k": "v"}


def test_a_second_registration_of_a_run_id_is_refused(store: DuckDBStore) -> None:
    store.ingest([_event("run_started", "0:0:run_started:", registration="first")])
    refusals, _ = store.ingest([_event("run_started", "0:0:run_started:", registration="second", index=3)])
    assert [(r.index, r.code) for r in refusals] == [(3, "run_id_taken")]
    assert store.get_run("run-1")["registration_id"] == "first"


def test_snapshot_deltas_rebuild_every_history(store: DuckDBStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write_path_module, "FULL_REFS_EVERY", 3)
    messages = [_message(i) for i in range(12)]
    records = [_snapshot(0, messages[:2], base=None, keep=0, send=messages[:2])]
    for index in range(1, 6):
        size = 2 + 2 * index
        records.append(_snapshot(index, messages[:size], base=index - 1, keep=size - 2, send=messages[size - 2 : size]))
    refusals, _ = store.ingest(records)
    assert refusals == []
    info, bodies = store.read_snapshot("run-1", include_interrupted=False)
    assert info["snapshot_index"] == 5 and bodies == messages
    # Every third snapshot holds its whole list, so no read walks a long chain.
    cursor = store.cursor()
    bases = [b for (b,) in cursor.execute("SELECT base_index FROM snapshots ORDER BY write_seq").fetchall()]
    assert bases == [None, 0, 1, None, 3, 4]
    # Each distinct message is stored once.
    assert cursor.execute("SELECT count(*) FROM messages").fetchone()[0] == 12


def test_snapshot_referring_to_an_unknown_message_is_refused(store: DuckDBStore) -> None:
    record = _snapshot(0, [_message(1)], base=None, keep=0, send=[])
    refusals, _ = store.ingest([record])
    assert [r.code for r in refusals] == ["unknown_message"]
    assert store.read_snapshot("run-1", include_interrupted=True) is None


def test_latest_snapshot_is_last_written_and_skips_interrupted(store: DuckDBStore) -> None:
    messages = [_message(i) for i in range(3)]
    store.ingest(
        [
            _snapshot(0, messages[:2], base=None, keep=0, send=messages[:2]),
            _snapshot(1, messages[:3], base=0, keep=2, send=messages[2:], state="interrupted"),
        ]
    )
    complete, _ = store.read_snapshot("run-1", include_interrupted=False)
    newest, bodies = store.read_snapshot("run-1", include_interrupted=True)
    assert (complete["snapshot_index"], newest["snapshot_index"]) == (0, 1)
    assert bodies == messages


def test_replayed_snapshot_keys_are_suppressed_by_high_water(store: DuckDBStore) -> None:
    messages = [_message(i) for i in range(3)]
    first = _snapshot(0, messages[:2], base=None, keep=0, send=messages[:2])
    second = _snapshot(1, messages[:3], base=0, keep=2, send=messages[2:])
    store.ingest([first, second])
    _, suppressed = store.ingest([first, second])
    assert suppressed == 2
    assert store.cursor().execute("SELECT count(*) FROM snapshots").fetchone()[0] == 2


def test_tool_effect_ledger_latest_wins_and_annotations_survive(store: DuckDBStore) -> None:
    def effect(status: str, index: int, **annotations) -> ToolEffectRecord:
        return ToolEffectRecord(
            _lineage(key=f"{index}:c1:{status}", index=index), status, "c1", "label", None,
            annotations.get("idempotency_key"), annotations.get("effect_summary"),
        )  # fmt: skip

    store.ingest([effect("started", 0), effect("annotated", 1, idempotency_key="label-9", effect_summary="set")])
    (unresolved,) = store.list_tool_effects("run-1", unresolved_only=True)
    assert (unresolved["status"], unresolved["idempotency_key"], unresolved["ended_at_ns"]) == (
        "started",
        "label-9",
        None,
    )
    store.ingest([effect("completed", 2)])
    assert store.list_tool_effects("run-1", unresolved_only=True) == []
    (done,) = store.list_tool_effects("run-1", unresolved_only=False)
    assert (done["status"], done["idempotency_key"], done["effect_summary"]) == ("completed", "label-9", "set")
    assert done["ended_at_ns"] is not None


def test_state_survives_reopening_the_file(tmp_path: Path) -> None:
    path = tmp_path / "steprec.duckdb"
    messages = [_message(i) for i in range(3)]
    first = DuckDBStore(path)
    first.ingest([_event("run_started", "0:0:run_started:", registration="reg"),
                  _snapshot(0, messages[:2], base=None, keep=0, send=messages[:2])])  # fmt: skip
    first.close()
    reopened = DuckDBStore(path)
    refusals, suppressed = reopened.ingest(
        [
            _event("run_started", "0:0:run_started:", registration="other", index=0),
            _snapshot(0, messages[:2], base=None, keep=0, send=messages[:2]),
            _snapshot(1, messages[:3], base=0, keep=2, send=messages[2:]),
        ]
    )
    assert [r.code for r in refusals] == ["run_id_taken"] and suppressed == 1
    assert reopened.read_snapshot("run-1", include_interrupted=False)[1] == messages
    reopened.close()


def _keyed_snapshot(index: int, key: str, messages: list[str], state: str = "complete") -> SnapshotRecord:
    return SnapshotRecord(
        _lineage(key=key, index=index), index, state, None, 0, tuple(_digest(m) for m in messages), messages
    )


def test_retention_keeps_newest_n_newest_overall_and_newest_complete(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "steprec.duckdb", max_snapshots_per_run=2)
    messages = [_message(i) for i in range(6)]
    states = ["complete", "interrupted", "interrupted", "interrupted"]
    store.ingest([_keyed_snapshot(i, f"{i}:{i}:{s}", messages[: i + 1], s) for i, s in enumerate(states)])
    cursor = store.cursor()
    kept = cursor.execute("SELECT snapshot_index FROM snapshots WHERE NOT pruned ORDER BY write_seq").fetchall()
    # Newest two are both interrupted, so the newest complete one (0) stays too.
    assert [k for (k,) in kept] == [0, 2, 3]
    assert store.read_snapshot("run-1", include_interrupted=False)[0]["snapshot_index"] == 0
    assert store.read_snapshot("run-1", include_interrupted=True)[1] == messages[:4]
    store.close()


def test_a_run_asks_for_its_own_bound_and_pruning_touches_only_that_run(store: DuckDBStore) -> None:
    messages = [_message(i) for i in range(5)]
    registered = StepEventRecord(_lineage(key="0:0:run_started:"), "run_started", None, None, None, {}, "reg", 1)
    store.ingest([registered] + [_keyed_snapshot(i, f"{i}:{i}:complete", messages[: i + 1]) for i in range(4)])
    other = [
        SnapshotRecord(_lineage("run-2", f"{i}:{i}:complete", i), i, "complete", None, 0, (_digest(messages[0]),), [])
        for i in range(3)
    ]
    store.ingest(other)
    counts = dict(
        store.cursor().execute("SELECT run_id, count(*) FROM snapshots WHERE NOT pruned GROUP BY run_id").fetchall()
    )
    assert counts == {"run-1": 1, "run-2": 3}


def test_the_default_bound_a_run_got_holds_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "steprec.duckdb"
    messages = [_message(i) for i in range(6)]
    registered = StepEventRecord(_lineage(key="0:0:run_started:"), "run_started", None, None, None, {}, "reg", None)
    store = DuckDBStore(path, max_snapshots_per_run=1)
    store.ingest([registered] + [_keyed_snapshot(i, f"{i}:{i}:complete", messages[: i + 1]) for i in range(3)])
    store.close()
    store = DuckDBStore(path, max_snapshots_per_run=1)
    store.ingest([_keyed_snapshot(i, f"{i}:{i}:complete", messages[: i + 1]) for i in range(3, 6)])
    kept = store.cursor().execute("SELECT snapshot_index FROM snapshots WHERE NOT pruned").fetchall()
    assert kept == [(5,)]
    store.close()


def test_the_high_water_mark_survives_pruning_and_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "steprec.duckdb"
    messages = [_message(i) for i in range(4)]
    store = DuckDBStore(path, max_snapshots_per_run=1)
    # Key 2 is numbered, the newest ("x") is not: retention drops 2, yet 2 stays the high-water mark.
    store.ingest([_keyed_snapshot(0, "1:0:complete", messages[:1]), _keyed_snapshot(1, "2:1:complete", messages[:2]),
                  _keyed_snapshot(2, "x", messages[:3])])  # fmt: skip
    store.close()
    store = DuckDBStore(path, max_snapshots_per_run=1)
    _, suppressed = store.ingest([_keyed_snapshot(3, "1:9:complete", messages[:1])])  # older than the mark
    assert suppressed == 1
    _, suppressed = store.ingest([_keyed_snapshot(4, "2:1:complete\nforged", messages[:2])])  # same number, other key
    assert suppressed == 0
    _, suppressed = store.ingest([_keyed_snapshot(5, "x", messages[:3])])  # unnumbered: only against retained ones
    assert suppressed == 0
    store.close()


def test_unnumbered_keys_suppress_only_while_retained(store: DuckDBStore) -> None:
    messages = [_message(i) for i in range(2)]
    _, suppressed = store.ingest([_keyed_snapshot(0, "alpha", messages[:1]), _keyed_snapshot(1, "alpha", messages[:1])])
    assert suppressed == 1


def test_unnumbered_keys_stop_suppressing_once_their_snapshot_is_pruned(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "steprec.duckdb", max_snapshots_per_run=1)
    messages = [_message(i) for i in range(4)]
    for index, key in enumerate(["alpha", "beta", "gamma"]):
        _, suppressed = store.ingest([_keyed_snapshot(index, key, messages[: index + 1])])
        assert suppressed == 0
    _, suppressed = store.ingest([_keyed_snapshot(3, "gamma", messages[:4])])  # retained: a replay
    assert suppressed == 1
    _, suppressed = store.ingest([_keyed_snapshot(3, "alpha", messages[:4])])  # pruned: a new snapshot
    assert suppressed == 0
    store.close()


def test_retention_stays_bounded_under_concurrent_saves(tmp_path: Path) -> None:
    import threading

    store = DuckDBStore(tmp_path / "steprec.duckdb", max_snapshots_per_run=3)
    messages = [_message(i) for i in range(200)]

    def save(thread: int) -> None:
        for i in range(25):
            index = thread * 25 + i
            store.ingest([_keyed_snapshot(index, f"t{thread}-{i}", messages[index : index + 1])])

    threads = [threading.Thread(target=save, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    kept = store.cursor().execute("SELECT count(*) FROM snapshots WHERE run_id = 'run-1' AND NOT pruned").fetchone()
    assert kept[0] == 3  # all complete: the newest three, which include the newest overall and complete
    store.close()


def drop_columns(connection: duckdb.DuckDBPyConnection, table: str, *columns: str) -> None:
    """Undo a migration that added `columns` to `table`, to make a file an older recorder left."""
    indexes = connection.execute("SELECT index_name, sql FROM duckdb_indexes() WHERE table_name = ?", [table])
    indexes = indexes.fetchall()
    for name, _ in indexes:  # DuckDB alters no table with an index
        connection.execute(f"DROP INDEX {name}")
    for column in columns:
        connection.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    for _, sql in indexes:
        connection.execute(sql)


def test_a_version_1_file_gains_run_endings_from_its_events(tmp_path: Path) -> None:
    path = tmp_path / "steprec.duckdb"
    store = DuckDBStore(path)
    store.ingest([_event("run_started", "0:0:run_started:", registration="reg"),
                  _event("run_failed", "1:0:run_failed:", index=1)])  # fmt: skip
    store.close()
    # Make it the file a schema-1 recorder left: no run_endings table, version 1 recorded.
    old = duckdb.connect(str(path))
    old.execute("DROP TABLE run_endings")
    old.execute("DROP TABLE run_ancestry")
    drop_columns(old, "runs", "ended_at", "end_kind")
    old.execute("DROP TABLE conversations; DROP TABLE conversation_heads")  # schema 8
    old.execute("DELETE FROM steprec_schema WHERE version >= 2")
    old.close()
    store = DuckDBStore(path)
    (run,) = store.list_runs(run_id="run-1")
    assert run["outcome"] == "failed" and run["ended_at_ns"] is not None
    store.close()


def test_a_run_keeps_one_ending_its_latest_however_often_and_whenever_it_ends(tmp_path: Path) -> None:
    path = tmp_path / "steprec.duckdb"

    def ended(store: DuckDBStore) -> tuple[str, int, int]:
        (run,) = store.list_runs(run_id="run-1")
        cursor = store.cursor()
        rows = cursor.execute("SELECT count(*) FROM run_endings WHERE run_id = 'run-1'").fetchone()[0]
        events = cursor.execute("SELECT count(*) FROM events WHERE kind LIKE 'run_%ed' AND kind <> 'run_started'")
        return run["outcome"], rows, events.fetchone()[0]

    store = DuckDBStore(path)
    store.ingest([_event("run_started", "0:0:run_started:", registration="reg"),
                  _event("run_completed", "1:0:run_completed:", index=1),
                  _event("run_failed", "2:0:run_failed:", index=2)])  # fmt: skip
    assert ended(store) == ("failed", 1, 2)  # two endings in one request
    store.ingest([_event("run_completed", "3:0:run_completed:", index=3)])
    assert ended(store) == ("completed", 1, 3)  # and in a later one
    store.close()
    store = DuckDBStore(path)  # a new process: the run's state is loaded from the file
    store.ingest([_event("run_failed", "4:0:run_failed:", index=4)])
    assert ended(store) == ("failed", 1, 4)
    store.close()

    # A schema-3 file kept every ending: opening it keeps each run's latest.
    old = duckdb.connect(str(path))
    drop_columns(old, "run_endings", "run_seq")
    drop_columns(old, "runs", "ended_at", "end_kind")
    old.execute("INSERT INTO run_endings SELECT write_seq - 100, run_id, 'run_completed', ended_at FROM run_endings")
    old.execute("DROP TABLE conversations; DROP TABLE conversation_heads")  # schema 8
    old.execute("DELETE FROM steprec_schema WHERE version >= 4")
    old.close()
    store = DuckDBStore(path)
    assert ended(store) == ("failed", 1, 4)
    store.close()


def _descendant_outcomes(store: DuckDBStore, run_id: str) -> list[tuple[str, str]]:
    import pyarrow as pa
    from steprec.recorder.querier.sql import UNLIMITED

    table = pa.ipc.open_stream(b"".join(store.descendants(run_id, UNLIMITED))).read_all()
    return list(zip(table["run_id"].to_pylist(), table["outcome"].to_pylist(), strict=True))


def test_an_ending_staged_before_its_run_is_registered_still_ends_it(store: DuckDBStore) -> None:
    # A stranger may send the ending first; the applier finds the run's row once it is there.
    store.ingest([_event("run_completed", "1:0:run_completed:", index=1),
                  _event("run_started", "0:0:run_started:", registration="reg")])  # fmt: skip
    assert _descendant_outcomes(store, "run-1") == [("run-1", "completed")]


def _copied_endings(store: DuckDBStore) -> list[tuple]:
    """Each run's ending as its `runs` row carries it, beside the `run_endings` row it copies."""
    cursor = store.cursor()
    try:
        return cursor.execute(
            "SELECT r.run_id, r.end_kind, x.kind, r.ended_at = x.ended_at FROM runs r"
            " LEFT JOIN run_endings x ON x.run_id = r.run_id ORDER BY r.run_id"
        ).fetchall()
    finally:
        cursor.close()


def test_a_runs_row_carries_its_latest_ending_and_a_version_6_file_gains_it(tmp_path: Path) -> None:
    path = tmp_path / "steprec.duckdb"
    store = DuckDBStore(path)
    store.ingest([_event("run_started", "0:0:run_started:", registration="reg"),
                  _event("run_started", "0:0:run_started:", run_id="run-2", registration="reg-2"),
                  _event("run_completed", "1:0:run_completed:", index=1)])  # fmt: skip
    assert _copied_endings(store) == [("run-1", "run_completed", "run_completed", True), ("run-2", None, None, None)]
    store.ingest([_event("run_failed", "2:0:run_failed:", index=2)])  # a later ending replaces it
    assert _copied_endings(store) == [("run-1", "run_failed", "run_failed", True), ("run-2", None, None, None)]
    assert _descendant_outcomes(store, "run-1") == [("run-1", "failed")]
    assert _descendant_outcomes(store, "run-2") == [("run-2", "running")]
    store.close()
    # A schema-6 file has the endings only in run_endings: opening it copies them.
    old = duckdb.connect(str(path))
    drop_columns(old, "runs", "ended_at", "end_kind")
    old.execute("DROP TABLE conversations; DROP TABLE conversation_heads")  # schema 8
    old.execute("DELETE FROM steprec_schema WHERE version >= 7")
    old.close()
    store = DuckDBStore(path)
    assert _copied_endings(store) == [("run-1", "run_failed", "run_failed", True), ("run-2", None, None, None)]
    assert _descendant_outcomes(store, "run-1") == [("run-1", "failed")]
    store.close()


def test_an_ending_found_its_run_later_is_copied_into_the_runs_row_too(store: DuckDBStore) -> None:
    store.ingest([_event("run_completed", "1:0:run_completed:", run_id="run-3", index=1)])  # before its run
    assert _copied_endings(store) == []  # (each read waits for what was sent: each request is its own commit)
    store.ingest([_event("run_started", "2:0:run_started:", run_id="run-3", registration="reg-3")])
    assert _copied_endings(store) == [("run-3", None, "run_completed", None)]  # its row has no ending yet
    # The next ending staged without its run's row finds the rows of both.
    store.ingest([_event("run_failed", "1:0:run_failed:", run_id="run-4", index=1),
                  _event("run_started", "0:0:run_started:", run_id="run-4", registration="reg-4")])  # fmt: skip
    assert _copied_endings(store) == [("run-3", "run_completed", "run_completed", True),
                                      ("run-4", "run_failed", "run_failed", True)]  # fmt: skip
    assert _descendant_outcomes(store, "run-3") == [("run-3", "completed")]


def test_a_log_entry_of_the_first_format_still_ends_its_run(tmp_path: Path) -> None:
    """Entries a recorder before schema 5 logged carry no `run_endings`: they come from their events."""
    import marshal

    from steprec.recorder.store.batch import Batch, insert, to_arrow

    path = tmp_path / "steprec.duckdb"
    store = DuckDBStore(path)
    store.ingest([_event("run_started", "0:0:run_started:", registration="reg")])
    store.close()
    staged = Batch()
    staged.add("events", write_seq=10**6, run_id="run-1", kind="run_failed", step_index=0, recorded_at=1, metadata=[])
    tables = to_arrow([marshal.dumps(({"events": staged.columns["events"]}, [], []))])
    assert tables["run_endings"]["kind"].to_pylist() == ["run_failed"]
    connection = duckdb.connect(str(path))
    insert(connection, tables)
    connection.close()
    store = DuckDBStore(path)
    assert _descendant_outcomes(store, "run-1") == [("run-1", "failed")]
    store.close()


def test_the_message_cache_is_bounded_and_keeps_what_was_used() -> None:
    from steprec.recorder.store.message_cache import message_cache

    eight = message_cache()
    for n in range(8):
        eight.put(bytes([n]) * 32, "x" * 100)
    cache = message_cache(eight.bytes)  # room for exactly these eight
    for n in range(8):
        cache.put(bytes([n]) * 32, "x" * 100)
    cache.get_many({bytes([0]) * 32})  # used: survives the next eviction
    cache.put(bytes([8]) * 32, "y" * 100)
    assert set(cache.get_many({bytes([n]) * 32 for n in range(9)})) == {bytes([n]) * 32 for n in (0, *range(2, 9))}
    cache.put(bytes([9]) * 32, "z" * (eight.bytes // 8))  # over an eighth of the bound: not cached at all
    assert cache.get_many({bytes([9]) * 32}) == {}


def test_a_snapshot_reads_the_same_from_the_cache_and_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "steprec.duckdb"
    messages = [_message(i) for i in range(40)]
    store = DuckDBStore(path)
    store.ingest([_keyed_snapshot(i, f"{i}:{i}:complete", messages[: i + 1]) for i in range(40)])
    warm = store.read_snapshot("run-1", include_interrupted=False)
    store.close()
    store = DuckDBStore(path)  # a new process: nothing cached
    assert store.read_snapshot("run-1", include_interrupted=False) == warm and warm[1] == messages
    store.close()


def test_a_kept_snapshot_answer_follows_new_snapshots_retention_and_prunes(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "steprec.duckdb", max_snapshots_per_run=2)
    messages = [_message(i) for i in range(6)]
    latest = {"include_interrupted": False}

    def index(**which) -> int | None:
        found = store.read_snapshot("run-1", **which)
        return None if found is None else found[0]["snapshot_index"]

    registered = StepEventRecord(_lineage(key="0:0:run_started:"), "run_started", None, None, None, {}, "reg", 2)
    store.ingest([registered] + [_keyed_snapshot(i, f"{i}:{i}:complete", messages[: i + 1]) for i in range(2)])
    assert index(**latest) == 1 and store.kept_snapshot("run-1", **latest)[0]["snapshot_index"] == 1
    assert index(include_interrupted=False, snapshot_index=0) == 0
    assert store.kept_snapshot("run-2", **latest) is None  # never read: nothing kept
    store.ingest([_keyed_snapshot(2, "2:2:interrupted", messages[:3], "interrupted")])
    assert store.kept_snapshot("run-1", **latest) is None  # its run changed
    assert (index(**latest), index(include_interrupted=True)) == (1, 2)
    store.ingest([_keyed_snapshot(3, "3:3:complete", messages[:4])])
    assert index(**latest) == 3
    # Retention pruned snapshot 0 in that commit: the answer kept for it went with it.
    assert store.kept_snapshot("run-1", include_interrupted=False, snapshot_index=0) is None
    assert index(include_interrupted=False, snapshot_index=0) is None
    assert index(**latest) == 3 and store.kept_snapshot("run-1", **latest) is not None
    assert store.prune(started_before_ns=None, conversation_id="conv").runs == 1
    assert store.kept_snapshot("run-1", **latest) is None and index(**latest) is None
    store.close()


def test_an_answer_found_while_its_run_changed_is_used_once_and_not_kept() -> None:
    from steprec.recorder.store.snapshot_choices import SnapshotChoices

    choices, key = SnapshotChoices(max_tracked_runs=2), ("run-1", False, None)

    def found_during_a_commit() -> int:
        choices.changed(["run-1"])  # the applier commits while the statement runs
        return 7

    assert choices.choose(key, found_during_a_commit) == 7 and choices.kept(key) is None
    assert choices.choose(key, lambda: 8) == 8 and choices.kept(key) == 8
    assert choices.choose(key, lambda: pytest.fail("a kept answer is not looked up again")) == 8
    choices.changed(["run-2"])  # another run's commit leaves it
    assert choices.kept(key) == 8
    choices.changed(["run-3"])
    choices.changed(["run-4"])  # run-1's own change is forgotten now: only a bound on it is left
    assert choices.kept(key) is None  # stale as far as anyone can tell, so asked again
    assert choices.choose(key, lambda: 9) == 9 and choices.kept(key) == 9
    assert choices.choose(("run-5", False, None), lambda: None) is None  # no snapshot: not kept
    choices.changed_all()
    assert choices.kept(key) is None


def test_only_message_text_and_reference_lists_are_stored_with_zstd(tmp_path: Path) -> None:
    path = tmp_path / "steprec.duckdb"
    store = DuckDBStore(path)
    messages = [json.dumps({"kind": "request", "parts": [{"content": f"m{i} " * 60}]}) for i in range(300)]
    registered = StepEventRecord(_lineage(key="0:0:run_started:"), "run_started", None, None, None, {}, "reg", 2)
    store.ingest([registered] + [_keyed_snapshot(i, f"{i}:{i}:complete", messages[: i + 1]) for i in range(300)])
    store.close()  # a clean stop checkpoints: the rows are compressed now
    connection = duckdb.connect(str(path), read_only=True)
    compression = dict(
        connection.execute(
            "SELECT table_name || '.' || column_name, string_agg(DISTINCT compression, ',') FROM ("
            " SELECT 'messages' AS table_name, * FROM pragma_storage_info('messages')"
            " UNION ALL SELECT 'snapshots', * FROM pragma_storage_info('snapshots')"
            " UNION ALL SELECT 'runs', * FROM pragma_storage_info('runs')"
            ") WHERE segment_type <> 'VALIDITY' AND compression <> 'Constant' GROUP BY ALL"
        ).fetchall()
    )
    connection.close()
    assert compression["messages.body"] == compression["snapshots.refs"] == "ZSTD"
    assert "ZSTD" not in compression["snapshots.run_id"] + compression["runs.run_id"] + compression["messages.digest"]


def _first_snapshot(run_id: str, messages: list[str]) -> SnapshotRecord:
    appended = tuple(_digest(m) for m in messages)
    return SnapshotRecord(_lineage(run_id, key="0:0:complete"), 0, "complete", None, 0, appended, messages)


def _message_rows(store: DuckDBStore) -> int:
    with store.cursor() as cursor:
        return cursor.execute("SELECT count(*) FROM messages").fetchone()[0]


def test_a_message_many_runs_carry_is_stored_once_whether_logged_applied_or_only_in_the_file(tmp_path: Path) -> None:
    # The stored-messages answer comes from the log's pending digests, from the memory of applied
    # ones, or from DuckDB after a restart: each path must say "stored" and store nothing again.
    shared = [_message(0), _message(1)]
    store = DuckDBStore(tmp_path / "steprec.duckdb")
    assert store.ingest([_first_snapshot("run-a", shared)]) == ([], 0)
    assert store.ingest([_first_snapshot("run-b", shared)]) == ([], 0)  # still pending in the log
    store.read_messages([_digest(shared[0])])  # waits until applied
    assert store.ingest([_first_snapshot("run-c", shared + [_message(2)])]) == ([], 0)  # from the memory
    store.close()
    store = DuckDBStore(tmp_path / "steprec.duckdb")
    try:
        assert store.ingest([_first_snapshot("run-d", shared)]) == ([], 0)  # from the file
        assert _message_rows(store) == 3
        for run_id in ("run-a", "run-b", "run-c", "run-d"):
            _, messages = store.read_snapshot(run_id, include_interrupted=False)
            assert messages[:2] == shared
    finally:
        store.close()


def test_after_prune_a_message_carried_again_is_stored_again(store: DuckDBStore) -> None:
    # Prune deletes messages only pruned runs referred to: what the write path remembered as stored
    # must be forgotten, or the next run carrying the message would refer to a missing body.
    shared = [_message(0)]
    store.ingest([_event("run_started", "0:0:run_started:", run_id="old", registration="r"),
                  _first_snapshot("old", shared)])  # fmt: skip
    store.read_messages([_digest(shared[0])])
    assert store.prune(started_before_ns=2_000_000_000_000_000_000, conversation_id=None).messages == 1
    assert _message_rows(store) == 0
    assert store.ingest([_first_snapshot("new", shared)]) == ([], 0)
    assert store.read_snapshot("new", include_interrupted=False)[1] == shared
    assert _message_rows(store) == 1
