"""Reads on a full recorder beside pydantic-ai-harness's SqliteStepStore: continue_run, list_runs, run trees.

A recorder process (loopback, fresh data folder) and a SqliteStepStore file are filled with the same data:

- 100,000 runs (10,000 with --quick) forming one tree under a root, fan-out 10 (the root and 5 levels
  below it), grouped into conversations of 10 consecutive runs, each run with the four events of a
  one-request run. steprec gets them as OTLP log records built straight into pre-encoded Export requests
  (as the ingest benchmark's load does) sent over loopback, and the fill rate is reported; the harness
  through `register_run` for a sample, then `executemany` on its own tables.
- one long run, 1000 steps (200 with --quick): the FunctionModel agent of benchmarks/common.py (one tool
  call per step, 2048-character tool returns) run for real with StepRecorder and with the harness's
  StepPersistence. When the overhead measurement ran first in the same invocation, its run of that size
  is taken over (a recorder data folder and a SqliteStepStore file, each holding just that run) and the
  bulk runs are added to them; otherwise this measurement writes the two runs itself.

Then the same reads on both, interleaved call by call after a warm-up: `continue_run` of the long run,
`list_runs` of a random conversation, all descendants of runs at each level of the tree (steprec's
`run_tree`; the harness has no tree read, so a breadth-first `list_runs(parent_run_id=...)` per run) and
one analytical SQL query. Last, with the recorder stopped, its DuckDB file is
opened in this process to split where steprec's time goes. A full run takes about four minutes on two
cores once the long runs exist (writing them takes another six, most of it the harness's); --quick about
half a minute.
"""

from __future__ import annotations

import asyncio
import gc
import random
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from pydantic_ai.messages import ModelMessagesTypeAdapter
from pydantic_ai_harness.step_persistence import RunRecord as HarnessRunRecord
from pydantic_ai_harness.step_persistence import SqliteStepStore, StepPersistence
from pydantic_ai_harness.step_persistence import continue_run as harness_continue_run
from steprec.exporter import StepRecorder, shutdown_pipelines
from steprec.proto import wire
from steprec.proto.query.v1 import query_pb2 as pb
from steprec.query import RecorderClient, continue_run
from steprec.query import client as query_client
from steprec.recorder.daemon.process import RecorderProcess
from steprec.recorder.daemon.server import DATABASE_NAME
from steprec.recorder.querier import query_service
from steprec.recorder.querier.sql import UNLIMITED
from steprec.recorder.store.connection import skip_pandas_lookups
from steprec.recorder.store.duckdb_store import DuckDBStore

from benchmarks import browser_pages
from benchmarks.common import (
    LongRun,
    Outcome,
    Target,
    Workspace,
    agent,
    folder_bytes,
    payloads,
    percentile,
    progress,
    timed_run,
)

FULL = {
    "runs": 100_000, "steps": 1000, "repeats": 50, "list_repeats": 200, "sql_repeats": 20, "tree_repeats": 3,
    "register": 2_000,
}  # fmt: skip
QUICK = {
    "runs": 10_000, "steps": 200, "repeats": 20, "list_repeats": 100, "sql_repeats": 10, "tree_repeats": 3,
    "register": 500,
}  # fmt: skip
WARMUP = 3
FANOUT = 10
CONVERSATION_RUNS = 10
RUNS_PER_REQUEST = 500  # 2,000 records, about 0.5 MB: well under gRPC's 4 MiB cap
AGENT_NAME = "bench-agent"
BASE_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z; run i starts i ms later
EVENTS = [("run_started", 0), ("model_request_started", 1), ("model_request_completed", 1), ("run_completed", 1)]
EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
TREE_TIMEOUT = 600.0
BIG_TREE = 5_000
"""The harness's breadth-first walk of a larger tree is timed once (it is the sum of that many calls)."""
ANALYTICAL_SQL = "SELECT kind, count(*) AS events, count(DISTINCT run_id) AS runs FROM events GROUP BY kind"
TARGETS_MS = {"continue_run": 5.0, "list_runs": 20.0, "run_tree": 100.0}


# -- the data ------------------------------------------------------------------------------------


def run_id(i: int) -> str:
    return f"run-{i:06d}"


def parent_of(i: int) -> int | None:
    return None if i == 0 else (i - 1) // FANOUT


def conversation_of(i: int) -> str:
    return f"conv-{i // CONVERSATION_RUNS:05d}"


def started_ns(i: int) -> int:
    return BASE_NS + i * 1_000_000


def subtree_size(root: int, runs: int) -> int:
    """How many runs the tree below `root` (itself included) holds among the first `runs`."""
    size, level = 0, [root]
    while level:
        size += len(level)
        level = [c for p in level for c in range(p * FANOUT + 1, p * FANOUT + FANOUT + 1) if c < runs]
    return size


def _attribute(key: str, value: str | int) -> KeyValue:
    any_value = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
    return KeyValue(key=key, value=any_value)


def fill_requests(runs: int) -> list[bytes]:
    """Pre-encoded Export requests carrying every bulk run's four events, as StepRecorder would send them."""
    requests = []
    for start in range(0, runs, RUNS_PER_REQUEST):
        records = []
        for i in range(start, min(runs, start + RUNS_PER_REQUEST)):
            lineage = [
                _attribute(wire.RUN_ID, run_id(i)),
                _attribute(wire.CONVERSATION_ID, conversation_of(i)),
                _attribute(wire.AGENT_NAME, AGENT_NAME),
            ]
            if (parent := parent_of(i)) is not None:
                lineage.append(_attribute(wire.PARENT_RUN_ID, run_id(parent)))
            for n, (kind, step) in enumerate(EVENTS):
                attributes = [*lineage, _attribute(wire.STEP_INDEX, step), _attribute(wire.IDEMPOTENCY_KEY,
                              f"{n}:{step}:{kind}:")]  # fmt: skip
                if kind == "run_started":
                    attributes.append(_attribute(wire.REGISTRATION_ID, f"reg-{i}"))
                records.append(
                    LogRecord(
                        time_unix_nano=started_ns(i) + n * 100_000,
                        event_name=wire.EVENT_PREFIX + kind,
                        severity_number=9,  # INFO
                        attributes=attributes,
                    )
                )
        request = logs_service_pb2.ExportLogsServiceRequest(
            resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=records)])]
        )
        requests.append(request.SerializeToString())
    return requests


def _at(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, UTC)


def _harness_run(i: int) -> HarnessRunRecord:
    parent = parent_of(i)
    return HarnessRunRecord(
        run_id=run_id(i),
        conversation_id=conversation_of(i),
        parent_run_id=run_id(parent) if parent is not None else None,
        agent_name=AGENT_NAME,
        started_at=_at(started_ns(i)),
        registration_id=f"reg-{i}",
    )


# -- filling -------------------------------------------------------------------------------------


def fill_recorder(endpoint: str, requests: list[bytes]) -> list[float]:
    """Send the requests in order on one channel; the seconds each took until acknowledged."""
    channel = grpc.insecure_channel(endpoint)
    export = channel.unary_unary(EXPORT, response_deserializer=logs_service_pb2.ExportLogsServiceResponse.FromString)
    seconds: list[float] = []
    try:
        for payload in requests:
            started = time.perf_counter()
            answer = export(payload, timeout=120)
            seconds.append(time.perf_counter() - started)
            if answer.partial_success.rejected_log_records:
                raise RuntimeError(f"the recorder refused records: {answer.partial_success.error_message[:500]}")
            if len(seconds) % 20 == 0:
                rate = 20 * RUNS_PER_REQUEST / sum(seconds[-20:])
                _progress(f"{len(seconds) * RUNS_PER_REQUEST:,} runs acknowledged; lately {rate:,.0f} runs/s")
    finally:
        channel.close()
    return seconds


async def fill_harness(path: Path, runs: int, sample: int) -> dict[str, float]:
    """The same runs and events in a SqliteStepStore: the first `sample` runs through register_run, the rest
    and all events by executemany on its tables."""
    store = SqliteStepStore(database=path)
    sample = min(runs, sample)
    started = time.perf_counter()
    for i in range(sample):
        await store.register_run(_harness_run(i))
    registered = time.perf_counter() - started
    started = time.perf_counter()
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("BEGIN")
        connection.executemany(
            "INSERT INTO runs (run_id, conversation_id, parent_run_id, agent_name, metadata, started_at,"
            " registration_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                (r.run_id, r.conversation_id, r.parent_run_id, r.agent_name, "{}", r.started_at.isoformat(),
                 r.registration_id)
                for r in map(_harness_run, range(sample, runs))
            ),
        )  # fmt: skip
        connection.executemany(
            "INSERT INTO events (run_id, kind, step_index, timestamp, conversation_id, parent_run_id, agent_name,"
            " metadata, idempotency_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                (run_id(i), kind, step, _at(started_ns(i) + n * 100_000).isoformat(), conversation_of(i),
                 run_id(parent_of(i)) if i else None, AGENT_NAME, "{}", f"{n}:{step}:{kind}:")
                for i in range(runs)
                for n, (kind, step) in enumerate(EVENTS)
            ),
        )  # fmt: skip
        connection.execute("COMMIT")
    finally:
        connection.close()
    return {"register_run_per_s": sample / registered, "bulk_seconds": time.perf_counter() - started}


async def write_long_runs(folder: Path, steps: int) -> LongRun:
    """One real `agent.run` of `steps` tool steps into a fresh recorder, and one into a fresh SqliteStepStore."""
    _progress(f"one {steps}-step agent run with StepRecorder")
    with RecorderProcess(folder / "recorder") as recorder:
        recorder_seconds, _ = await timed_run(
            agent(payloads(steps), [StepRecorder(endpoint=recorder.endpoint, journal_dir=folder / "journal")])
        )
        shutdown_pipelines()
    _progress(f"the same {steps}-step agent run with StepPersistence(SqliteStepStore)")
    database = folder / "harness.sqlite"
    harness_seconds, _ = await timed_run(
        agent(payloads(steps), [StepPersistence(store=SqliteStepStore(database=database))])
    )
    return LongRun(steps, database, harness_seconds, folder / "recorder", recorder_seconds)


# -- reading -------------------------------------------------------------------------------------


@dataclass
class Series:
    """Timings of one read on one store, in seconds, or the error that stopped it."""

    seconds: list[float] = field(default_factory=list)
    error: str = ""

    def pct(self, q: float) -> float:
        return percentile(self.seconds, q)

    def cell(self) -> str:
        if self.error:
            return f"**failed**: {self.error}"
        return f"{self.pct(0.5) * 1000:,.1f} / {self.pct(0.99) * 1000:,.1f} (n={len(self.seconds)})"


async def _timed(read: Callable[[int], Awaitable[object]], n: int) -> float:
    started = time.perf_counter()
    await read(n)
    return time.perf_counter() - started


async def interleaved(
    reads: dict[str, Callable[[int], Awaitable[object]]], repeats: int, *, warmup: int = WARMUP
) -> dict[str, Series]:
    """Every read `repeats` times after `warmup` untimed calls, alternating which store goes first.

    A read that raises is recorded with its error and not called again: a failed read is a result.
    """
    series = {name: Series() for name in reads}
    names = list(reads)
    for name, read in reads.items():
        try:
            for n in range(warmup):
                await read(-1 - n)
        except Exception as error:
            series[name].error = _error_text(error)
            names.remove(name)
    gc.collect()
    for n in range(repeats):
        for name in list(names) if n % 2 == 0 else names[::-1]:
            try:
                series[name].seconds.append(await _timed(reads[name], n))
            except Exception as error:
                series[name].error = _error_text(error)
                names.remove(name)
    return series


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"


async def harness_descendants(store: SqliteStepStore, root: str) -> int:
    """All runs under `root` by breadth-first `list_runs(parent_run_id=...)`, one call per run: the harness
    has no tree read. Returns how many runs the tree holds, root included."""
    found, level = 1, [root]
    while level:
        below = []
        for parent in level:
            below += [run.run_id for run in await store.list_runs(parent_run_id=parent)]
        found += len(below)
        level = below
    return found


def _tree_size(tree: Any) -> int:
    return sum(1 for _ in tree.walk())


async def raw_snapshot(client: RecorderClient, run: str) -> list[bytes]:
    """ReadSnapshot's message bytes as they arrive, not validated: the transfer without the client's parsing."""
    messages = []
    async for chunk in client._stub.ReadSnapshot(pb.ReadSnapshotRequest(run_id=run), timeout=client.timeout):
        messages.extend(chunk.messages_json)
        if chunk.message_piece:
            raise RuntimeError("the long run has no message larger than a chunk; this reader does not join pieces")
    return messages


# -- where steprec's time goes (recorder stopped, its database opened here) ------------------------


class TimedCursor:
    """A DuckDB cursor that appends the seconds each statement takes (execute plus fetch) to `log`."""

    def __init__(self, cursor: Any, log: list[float]) -> None:
        self._cursor, self._log = cursor, log

    def execute(self, sql: str, parameters: Any = None) -> TimedCursor:
        started = time.perf_counter()
        self._cursor.execute(sql, parameters) if parameters is not None else self._cursor.execute(sql)
        self._log.append(time.perf_counter() - started)
        return self

    def _fetch(self, name: str) -> Any:
        started = time.perf_counter()
        rows = getattr(self._cursor, name)()
        self._log[-1] += time.perf_counter() - started
        return rows

    def fetchall(self) -> Any:
        return self._fetch("fetchall")

    def fetchone(self) -> Any:
        return self._fetch("fetchone")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __enter__(self) -> TimedCursor:  # the reads use their cursor as a context manager, closing it after
        return self

    def __exit__(self, *exc: object) -> None:
        self._cursor.close()


SLOW_SECONDS = 5.0
"""A store call slower than this is timed once, not repeated."""


@dataclass
class Split:
    """The median call of one store read: seconds in all, seconds inside each DuckDB statement, rows returned."""

    total: float
    statements: list[float]
    rows: int

    @property
    def sql(self) -> float:
        return sum(self.statements)


def split(log: list[float], call: Callable[[], Any], repeats: int) -> Split:
    calls: list[tuple[float, list[float], int]] = []
    for _ in range(repeats):
        log.clear()
        started = time.perf_counter()
        result = call()
        calls.append((time.perf_counter() - started, list(log), len(result)))
        if calls[0][0] > SLOW_SECONDS:
            break
    return Split(*sorted(calls, key=lambda c: c[0])[len(calls) // 2])


def profile(data_dir: Path, runs: int, conversations: list[str], long_run: str) -> dict[str, Any]:
    """steprec's store reads timed in this process on the recorder's database (set up as the daemon sets its
    process up), split into DuckDB statements and the Python around them; and a whole tree past the store."""
    skip_pandas_lookups()  # what `steprec serve` does at start
    store = DuckDBStore(data_dir / DATABASE_NAME)
    log: list[float] = []
    plain_cursor = store.cursor
    store.cursor = lambda: TimedCursor(plain_cursor(), log)  # type: ignore[method-assign]
    names = iter(conversations * 2)
    reads: dict[str, tuple[Callable[[], Any], int]] = {
        "read_snapshot": (lambda: store.read_snapshot(long_run, include_interrupted=False)[1], 20),
        "read_snapshot_digests": (
            lambda: store.read_snapshot(long_run, include_interrupted=False, digests_only=True)[1],
            20,
        ),
        "list_runs": (lambda: store.list_runs(conversation_id=next(names)), 50),
    }
    for root in [*tree_roots(runs), 0]:
        reads[f"run_tree:{root}"] = (lambda r=root: store.run_tree(run_id(r), ancestors=False), 5)
        reads[f"descendants:{root}"] = (lambda r=root: b"".join(store.descendants(run_id(r), UNLIMITED)), 5)
    out: dict[str, Any] = {}
    try:
        for name, (call, repeats) in reads.items():
            _progress(f"profile: {name}")
            out[name] = split(log, call, repeats)
        out.update(tree_payload(store.run_tree(run_id(0), ancestors=False)))
    finally:
        store.cursor = plain_cursor  # type: ignore[method-assign]
        store.close()
    return out


def tree_payload(rows: list[dict]) -> dict[str, Any]:
    """A whole tree past the store: the recorder's protobuf of the rows, its bytes, the client's records."""
    out: dict[str, Any] = {"payload_runs": len(rows)}
    started = time.perf_counter()
    response = pb.GetRunTreeResponse(runs=[pb.TreeRun(run=query_service._run(row), depth=row["depth"]) for row in rows])
    out["pb_build"] = time.perf_counter() - started
    started = time.perf_counter()
    payload = response.SerializeToString()
    out["pb_serialize"], out["pb_bytes"] = time.perf_counter() - started, len(payload)
    started = time.perf_counter()
    parsed = pb.GetRunTreeResponse.FromString(payload)
    out["pb_parse"] = time.perf_counter() - started
    started = time.perf_counter()
    [query_client._run(entry.run) for entry in parsed.runs]
    out["client_records"] = time.perf_counter() - started
    return out


def _progress(message: str) -> None:
    progress("reads", message)


# -- the run -------------------------------------------------------------------------------------


def tree_roots(runs: int) -> list[int]:
    """Subtree roots one level apart, from about 100 runs up to (not including) the whole tree."""
    roots, node = [], 0
    while (node := node * FANOUT + 1) < runs:
        roots.append(node)
    return [r for r in reversed(roots) if subtree_size(r, runs) >= 100]


async def live_reads(
    client: RecorderClient, store: SqliteStepStore, harness_path: Path, runs: int, config: dict, long_runs: tuple
) -> dict[str, Any]:
    """Every read on both stores; the recorder still running. `long_runs`: the long run's id in each."""
    out: dict[str, Any] = {}
    steprec_long, harness_long = long_runs
    rng = random.Random(7)
    conversations = [conversation_of(rng.randrange(runs)) for _ in range(config["list_repeats"])]
    out["conversations"] = conversations

    async def steprec_continue(n: int) -> None:
        out["steprec_messages"] = len(await continue_run(client, run_id=steprec_long))

    uncached = RecorderClient(client.endpoint, message_cache_bytes=0)  # every read as a client's first

    async def steprec_first_read(n: int) -> None:
        await continue_run(uncached, run_id=steprec_long)

    async def harness_continue(n: int) -> None:
        out["harness_messages"] = len(await harness_continue_run(store, run_id=harness_long))

    _progress("continue_run")
    parts: dict[str, Series] = {"receive": Series(), "validate": Series()}

    async def steprec_in_parts(n: int) -> None:
        """continue_run's work with a clock between receiving the message bytes and validating them."""
        started = time.perf_counter()
        joined = b"[" + b",".join(await raw_snapshot(client, steprec_long)) + b"]"
        received = time.perf_counter()
        ModelMessagesTypeAdapter.validate_json(joined)
        if n >= 0:  # not a warm-up call
            parts["receive"].seconds.append(received - started)
            parts["validate"].seconds.append(time.perf_counter() - received)
        out["snapshot_bytes"] = len(joined)

    reads = {"steprec": steprec_continue, "steprec_first": steprec_first_read, "harness": harness_continue,
             "steprec_parts": steprec_in_parts}  # fmt: skip
    try:
        out["continue_run"] = await interleaved(reads, config["repeats"])
    finally:
        await uncached.close()
    out["continue_parts"] = out["continue_run"].pop("steprec_parts")
    out["receive"], out["validate"] = parts["receive"], parts["validate"]

    async def checked(read: Awaitable[list]) -> None:
        if len(found := await read) != CONVERSATION_RUNS:
            raise RuntimeError(f"expected {CONVERSATION_RUNS} runs in the conversation, got {len(found)}")

    _progress("list_runs(conversation_id=...)")
    out["list_runs"] = await interleaved(
        {
            "steprec": lambda n: checked(client.list_runs(conversation_id=conversations[n])),
            "harness": lambda n: checked(store.list_runs(conversation_id=conversations[n])),
        },
        config["list_repeats"],
    )
    _progress("analytical SQL")

    def harness_sql() -> list:
        connection = sqlite3.connect(harness_path)  # the harness has no query API: SQL on its file
        try:
            return connection.execute(ANALYTICAL_SQL).fetchall()
        finally:
            connection.close()

    out["sql"] = await interleaved(
        {"steprec": lambda n: client.sql(ANALYTICAL_SQL), "harness": lambda n: asyncio.to_thread(harness_sql)},
        config["sql_repeats"],
    )
    for root in [*tree_roots(runs), 0]:
        size = subtree_size(root, runs)
        _progress(f"descendants of a run with {size:,} runs in its tree")

        async def steprec_tree(n: int, root: int = root, size: int = size) -> None:
            if (found := _tree_size(await client.run_tree(run_id(root)))) != size:
                raise RuntimeError(f"run_tree returned {found} runs, expected {size}")

        async def steprec_table(n: int, root: int = root, size: int = size) -> None:
            if (found := (await client.descendants(run_id(root))).num_rows) != size:
                raise RuntimeError(f"descendants returned {found} runs, expected {size}")

        async def harness_tree(n: int, root: int = root, size: int = size) -> None:
            if (found := await harness_descendants(store, run_id(root))) != size:
                raise RuntimeError(f"the breadth-first walk found {found} runs, expected {size}")

        reads = {"steprec_table": steprec_table, "steprec": steprec_tree}
        if size <= BIG_TREE:
            out[f"tree:{root}"] = await interleaved(reads | {"harness": harness_tree}, config["tree_repeats"], warmup=1)
        else:  # the breadth-first walk makes one call per run: timed once
            out[f"tree:{root}"] = await interleaved(reads, config["tree_repeats"], warmup=1)
            out[f"tree:{root}"] |= await interleaved({"harness": harness_tree}, 1, warmup=0)
    return out


async def fill_and_read(folder: Path, config: dict, long: LongRun) -> dict[str, Any]:
    """Add the bulk runs to the recorder and the SqliteStepStore holding the long run, then read both."""
    runs = config["runs"]
    facts: dict[str, Any] = {"steprec_long_s": long.recorder_seconds, "harness_long_s": long.harness_seconds}
    _progress(f"encoding {runs:,} runs as OTLP Export requests")
    started = time.perf_counter()
    requests = fill_requests(runs)
    facts["encode_s"], facts["requests"] = time.perf_counter() - started, len(requests)
    facts["request_bytes"] = sum(map(len, requests))
    store = SqliteStepStore(database=long.harness_database)
    (harness_long,) = [run.run_id for run in await store.list_runs()]
    recorder = RecorderProcess(long.recorder_data).start()
    try:
        async with RecorderClient(recorder.endpoint, timeout_seconds=TREE_TIMEOUT) as client:
            (steprec_long,) = [run.run_id for run in await client.list_runs()]
            _progress(f"sending {len(requests):,} requests to the recorder at {recorder.endpoint}")
            facts["fill_request_s"] = fill_recorder(recorder.endpoint, requests)
            facts["fill_s"] = sum(facts["fill_request_s"])
            del requests
            started = time.perf_counter()
            await client.get_run(run_id(runs - 1))  # answered only once everything acknowledged is applied
            facts["apply_wait_s"] = time.perf_counter() - started
            _progress("filling the harness's SqliteStepStore with the same runs")
            facts["harness_fill"] = await fill_harness(long.harness_database, runs, config["register"])
            long_runs = (steprec_long, harness_long)
            facts.update(await live_reads(client, store, long.harness_database, runs, config, long_runs))
            _progress(f"timing the run browser's pages at {recorder.ui_url}")
            facts["browser"] = await asyncio.to_thread(
                browser_pages.measure, recorder.ui_url, root=run_id(0), long_run=steprec_long, repeats=config["repeats"]
            )
    finally:
        shutdown_pipelines()
        try:
            recorder.stop(timeout=60)
        except Exception:  # a read still running in the recorder (an abandoned run_tree) holds up the drain
            recorder.kill()
            facts["recorder_killed"] = True
    facts["recorder_bytes"] = folder_bytes(long.recorder_data)
    facts["harness_bytes"] = sum(p.stat().st_size for p in long.harness_database.parent.glob("*.sqlite*"))
    _progress("profiling the recorder's reads on its database, in this process")
    facts["profile"] = profile(long.recorder_data, runs, facts["conversations"], steprec_long)
    return facts


async def _measure(quick: bool, workspace: Workspace) -> dict[str, Any]:
    config = QUICK if quick else FULL
    folder = Path(tempfile.mkdtemp(prefix="reads-", dir=workspace.folder))
    long = workspace.long_runs.pop(config["steps"], None)
    facts = {"long_runs_taken_over": long is not None}
    if long is None:
        long = await write_long_runs(folder, config["steps"])
    return facts | await fill_and_read(folder, config, long)


def targets(config: dict, facts: dict[str, Any]) -> list[Target]:
    runs, steps = config["runs"], config["steps"]
    stated = (runs, steps) == (100_000, 1000)
    scale = "" if stated else f" (on {runs:,} runs and a {steps}-step run: not the stated size)"
    reads = {
        "continue_run": ("`continue_run` of a 1000-step run, p50 <= 5 ms", facts["continue_run"]),
        "list_runs": ("`list_runs(conversation_id=...)` p50 <= 20 ms", facts["list_runs"]),
        "run_tree": ("descendants of the root of a 100,000-run tree (`descendants()`) <= 100 ms", facts["tree:0"]),
    }
    found = []
    for key, (target, series) in reads.items():
        mine = series["steprec_table" if key == "run_tree" else "steprec"]
        measured = f"failed: {mine.error}" if mine.error else f"p50 {mine.pct(0.5) * 1000:,.1f} ms{scale}"
        met = not mine.error and mine.pct(0.5) * 1000 <= TARGETS_MS[key]
        found.append(Target(5, target + " (on 100,000 runs)", measured, met if stated else None))
    return found + browser_pages.targets(facts["browser"], stated=stated, scale=scale)


def main(quick: bool, workspace: Workspace) -> Outcome:
    config = QUICK if quick else FULL
    facts = asyncio.run(_measure(quick, workspace))
    markdown = render(quick, config, facts)
    print(markdown, end="", flush=True)
    return Outcome(
        data={"config": config, "facts": facts},
        targets=targets(config, facts),
        markdown=markdown,
        sections=sections(config, facts),
    )


# -- the report ----------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


def _met(series: Series, target_ms: float, config: dict) -> str:
    """The verdict; the targets are stated on 100,000 runs and a 1000-step run, so smaller data gets a caveat."""
    verdict = "**not met**" if series.error or series.pct(0.5) * 1000 > target_ms else "met"
    verdict += " (the read failed)" if series.error else ""
    return verdict if (config["runs"], config["steps"]) == (100_000, 1000) else f"{verdict} at this size only"


def data_text(config: dict, facts: dict[str, Any]) -> str:
    runs, steps = config["runs"], config["steps"]
    depth = len(str(runs)) - 1 if runs > 1 else 0
    origin = (
        "taken over from the overhead measurement of the same invocation"
        if facts["long_runs_taken_over"]
        else "written by this measurement"
    )
    return (
        f"Data, the same in both stores: {runs:,} runs forming one tree under `{run_id(0)}` (fan-out {FANOUT}, "
        f"{depth} levels below the root), in conversations of {CONVERSATION_RUNS} consecutive runs, each run with "
        f"{len(EVENTS)} events ({', '.join(k for k, _ in EVENTS)}); plus one {steps}-step run of the benchmark agent "
        "(one tool call per step, 2048-char tool returns) written by a real pydantic-ai Agent "
        f"({origin}): with StepRecorder in {facts['steprec_long_s']:,.1f} s, with StepPersistence(SqliteStepStore) "
        f"in {facts['harness_long_s']:,.1f} s. Its last complete snapshot holds {facts['steprec_messages']:,} "
        f"messages (harness: {facts['harness_messages']:,}). The recorder is a `RecorderProcess` on loopback; the "
        "harness store a file opened with `SqliteStepStore(database=...)`. On disk afterwards: the recorder's data "
        f"folder {facts['recorder_bytes']:,} bytes, the SQLite file (with its WAL) {facts['harness_bytes']:,} bytes.\n"
    )


def reads_table(config: dict, facts: dict[str, Any]) -> str:
    runs, steps = config["runs"], config["steps"]
    lines = [
        "p50 / p99 in ms (n timed calls, after a warm-up; the two stores alternate call by call).",
        "",
        "| read | steprec p50 / p99 | harness SqliteStepStore p50 / p99 | target (steprec, issue 5) | met? |",
        "|---|---:|---:|---|---|",
    ]
    cont, listed, tree = facts["continue_run"], facts["list_runs"], facts["tree:0"]
    lines += [
        f"| `continue_run(run_id=...)` of the {steps}-step run ({facts['steprec_messages']:,} messages) "
        f"| {cont['steprec'].cell()} | {cont['harness'].cell()} | p50 <= {TARGETS_MS['continue_run']:g} ms "
        f"| {_met(cont['steprec'], TARGETS_MS['continue_run'], config)} |",
        "| the same, by a client that has not read the run before (`RecorderClient(message_cache_bytes=0)`: "
        f"every message fetched and validated) | {cont['steprec_first'].cell()} | {cont['harness'].cell()} | | |",
        f"| `list_runs(conversation_id=...)`, a random conversation of {CONVERSATION_RUNS} runs "
        f"| {listed['steprec'].cell()} | {listed['harness'].cell()} | p50 <= {TARGETS_MS['list_runs']:g} ms "
        f"| {_met(listed['steprec'], TARGETS_MS['list_runs'], config)} |",
        f"| all descendants of the root ({runs:,} runs) as columns: steprec `descendants(root)` (a pyarrow Table); "
        f"harness has no tree read, so breadth-first `list_runs(parent_run_id=...)` per run ({runs:,} calls) "
        f"| {tree['steprec_table'].cell()} | {tree['harness'].cell()} | p50 <= {TARGETS_MS['run_tree']:g} ms "
        f"| {_met(tree['steprec_table'], TARGETS_MS['run_tree'], config)} |",
        f"| the same as objects: steprec `run_tree(root)` (a `RunTree` of `RunRecord`s); harness as above "
        f"| {tree['steprec'].cell()} | {tree['harness'].cell()} | p50 <= {TARGETS_MS['run_tree']:g} ms "
        f"| {_met(tree['steprec'], TARGETS_MS['run_tree'], config)} |",
        f"| analytical SQL over all events: `{ANALYTICAL_SQL}`; steprec `client.sql`, harness the same query "
        f"on its SQLite file with sqlite3 (it has no query API) | {facts['sql']['steprec'].cell()} "
        f"| {facts['sql']['harness'].cell()} | none set | |",
    ]
    return "\n".join(lines) + "\n"


def trees_table(config: dict, facts: dict[str, Any]) -> str:
    runs = config["runs"]
    lines = [
        "Descendants by tree size (of a run lower in the same tree; harness: the breadth-first walk, timed once "
        f"above {BIG_TREE:,} runs), p50 / p99 ms:",
        "",
        "| runs in the tree | steprec `descendants` | steprec `run_tree` | harness breadth-first |",
        "|---:|---:|---:|---:|",
    ]
    for root in [*tree_roots(runs), 0]:
        found = facts[f"tree:{root}"]
        lines.append(
            f"| {subtree_size(root, runs):,} | {found['steprec_table'].cell()} | {found['steprec'].cell()} "
            f"| {found['harness'].cell()} |"
        )
    return "\n".join(lines) + "\n"


def fill_table(config: dict, facts: dict[str, Any]) -> str:
    runs, fill, harness_fill = config["runs"], facts["fill_s"], facts["harness_fill"]
    tenth = max(1, len(facts["fill_request_s"]) // 10)
    first, last = sum(facts["fill_request_s"][:tenth]), sum(facts["fill_request_s"][-tenth:])
    records, registered = runs * len(EVENTS), min(runs, config["register"])
    lines = [
        "| store | how | seconds | rate |",
        "|---|---|---:|---:|",
        f"| steprec | build {facts['requests']:,} Export requests ({facts['request_bytes'] / 1e6:,.1f} MB protobuf) "
        f"| {facts['encode_s']:,.1f} | |",
        f"| steprec | send them in order on one loopback channel, until the last is acknowledged | {fill:,.1f} "
        f"| {runs / fill:,.0f} runs/s, {records / fill:,.0f} records/s |",
        f"| steprec | ... the first tenth of the requests / the last tenth | {first:,.1f} / {last:,.1f} "
        f"| {tenth * RUNS_PER_REQUEST / first:,.0f} / {tenth * RUNS_PER_REQUEST / last:,.0f} runs/s |",
        f"| steprec | then until applied to DuckDB (a read waits for it) | {facts['apply_wait_s']:,.1f} | |",
        f"| harness | `register_run`, first {registered:,} runs | "
        f"{registered / harness_fill['register_run_per_s']:,.1f} | {harness_fill['register_run_per_s']:,.0f} runs/s |",
        f"| harness | the other runs and all {records:,} events by `executemany` on its tables, one transaction "
        f"| {harness_fill['bulk_seconds']:,.1f} | |",
    ]
    return "\n".join(lines) + "\n"


def continue_pieces(facts: dict[str, Any]) -> str:
    snap, cont = facts["profile"]["read_snapshot"], facts["continue_run"]["steprec"]
    digests, first = facts["profile"]["read_snapshot_digests"], facts["continue_run"]["steprec_first"]
    parts, receive, validate = facts["continue_parts"], facts["receive"], facts["validate"]
    lines = [
        f"`continue_run` of the {facts['steprec_messages']:,}-message history "
        f"({facts['snapshot_bytes'] / 1e6:,.2f} MB of message JSON), piece by piece:",
        "",
        "| piece | ms |",
        "|---|---:|",
        f"| end to end, `continue_run` p50, by a client that has read the run before "
        f"| {_ms(cont.pct(0.5)) if not cont.error else cont.error} |",
        f"| ... of which the store's `read_snapshot(digests_only=True)` (measured after the recorder stopped) "
        f"| {_ms(digests.total)} |",
        f"| end to end, `continue_run` p50, by a client reading it for the first time (message cache off) "
        f"| {_ms(first.pct(0.5)) if not first.error else first.error} |",
        f"| the same work in two timed parts (interleaved with the above), p50 | {_ms(parts.pct(0.5))} |",
        f"| ... receiving: `ReadSnapshot` over gRPC until all the message bytes arrived, p50 "
        f"| {_ms(receive.pct(0.5))} |",
        f"| ... ... of which the store's `read_snapshot` (measured after the recorder stopped) | {_ms(snap.total)} |",
        f"| ... validating: `ModelMessagesTypeAdapter.validate_json` of those bytes, p50 | {_ms(validate.pct(0.5))} |",
    ]
    return "\n".join(lines) + "\n"


def profile_table(config: dict, facts: dict[str, Any]) -> str:
    runs, prof = config["runs"], facts["profile"]
    lines = [
        "The recorder's store reads, timed again in this process on its database once the recorder stopped (the "
        'same `DuckDBStore` code, the process set up as `steprec serve` sets itself up; the median call; "in '
        'DuckDB" is the time inside `execute` and `fetch*` of each statement, the rest is the Python around them; '
        "`descendants` is the recorder's whole answer, the query and its Arrow IPC stream).",
        "",
        "| read | end to end p50 | store call | in DuckDB (per statement) | Python around |",
        "|---|---:|---:|---:|---:|",
    ]
    ends = {"read_snapshot_digests": facts["continue_run"]["steprec"], "read_snapshot": facts["continue_run"][
        "steprec_first"], "list_runs": facts["list_runs"]["steprec"]}  # fmt: skip
    labels = {"read_snapshot_digests": "`continue_run`, read before (`read_snapshot`, digests only)",
              "read_snapshot": "`continue_run`, a client's first read (`read_snapshot`; the store has read it before)",
              "list_runs": "`list_runs(conversation_id=...)`"}  # fmt: skip
    for kind, end in (("run_tree", "steprec"), ("descendants", "steprec_table")):
        for root in [*tree_roots(runs), 0]:
            ends[f"{kind}:{root}"] = facts[f"tree:{root}"][end]
            labels[f"{kind}:{root}"] = f"`{kind}`, {subtree_size(root, runs):,} runs"
    for name, label in labels.items():
        found, end = prof[name], ends[name]
        statements = ", ".join(_ms(s) for s in found.statements) or "no statement"
        lines.append(
            f"| {label} | {_ms(end.pct(0.5)) if not end.error else 'failed'} | {_ms(found.total)} "
            f"| {_ms(found.sql)} ({statements}) | {_ms(found.total - found.sql)} |"
        )
    lines += [
        "",
        f"`run_tree` of the whole tree ({prof['payload_runs']:,} runs) past the store: the recorder's protobuf of "
        f"the rows {_ms(prof['pb_build'])} ms, serialised {_ms(prof['pb_serialize'])} ms ({prof['pb_bytes']:,} "
        f"bytes); the client's parse {_ms(prof['pb_parse'])} ms and `RunRecord`s {_ms(prof['client_records'])} ms "
        "(then the tree's links).",
    ]
    if facts.get("recorder_killed"):
        lines += ["", "The recorder did not stop within 60 s after the reads (a read still running) and was killed."]
    return "\n".join(lines) + "\n"


def sections(config: dict, facts: dict[str, Any]) -> dict[str, str]:
    return {
        "reads_data": data_text(config, facts),
        "reads": reads_table(config, facts),
        "reads_trees": trees_table(config, facts),
        "reads_continue": continue_pieces(facts),
        "reads_browser": browser_pages.table(facts["browser"]),
    }


def render(quick: bool, config: dict, facts: dict[str, Any]) -> str:
    parts = [
        f"# Reads on a full recorder beside pydantic-ai-harness{' (quick)' if quick else ''}",
        data_text(config, facts),
        "## Reads",
        reads_table(config, facts),
        trees_table(config, facts),
        "## The run browser's pages",
        browser_pages.table(facts["browser"]),
        "## Filling",
        fill_table(config, facts),
        "## Where steprec's time goes",
        profile_table(config, facts),
        continue_pieces(facts),
    ]
    return "\n".join(parts)
