"""Read-only SQL over the views: docs/sql.md's examples against known runs, the guards, and the Parquet export."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from steprec.exporter import StepRecorder
from steprec.proto.query.v1 import query_pb2 as pb
from steprec.query import ConversationStore, ConversationSummary, RecorderClient, truncated
from steprec.query.sql_commands import EXPORT_TABLES
from steprec.recorder.daemon.process import RecorderProcess
from steprec.recorder.querier.query_service import encoded_arrow_chunks
from steprec.recorder.querier.sql import EXPORTS

from .agents import tool_returns
from .crash_agent import eventually, spawn

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = dict(
    re.findall(r"```sql\n-- example: ([\w-]+)\n(.*?)```", (ROOT / "docs" / "sql.md").read_text(), flags=re.DOTALL)
)


def _scripted(*steps: tuple[str, dict] | str) -> FunctionModel:
    """A model that makes the given tool calls one per step, then answers with the final string."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = len(tool_returns(messages))
        step = steps[min(done, len(steps) - 1)]
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)])
        return ModelResponse(parts=[ToolCallPart(step[0], step[1], tool_call_id=f"{step[0]}-{done}")])

    return FunctionModel(model)


async def _record_a_tree(endpoint: str) -> tuple[str, str]:
    """A planner that checks the weather twice and delegates to a booker whose booking tool fails.

    Returns the planner's run id and the booker's (failed) run id.
    """
    booker = Agent(_scripted(("book", {"hotel": "Ritz"}), "booked"), name="booker",
                   capabilities=[StepRecorder(endpoint=endpoint)])  # fmt: skip

    @booker.tool_plain
    def book(hotel: str) -> str:
        raise RuntimeError(f"{hotel} is full")

    planner = Agent(
        _scripted(("weather", {"city": "Oslo"}), ("weather", {"city": "Rome"}), ("delegate", {}), "planned"),
        name="planner",
        capabilities=[StepRecorder(endpoint=endpoint)],
    )

    @planner.tool_plain
    def weather(city: str) -> str:
        return f"sunny in {city}"

    @planner.tool_plain
    async def delegate() -> str:
        try:
            await booker.run("book a hotel", conversation_id="conv-booking")
        except RuntimeError as error:
            return f"booking failed: {error}"
        return "booked"

    result = await planner.run("plan a trip", conversation_id="conv-trip")
    async with RecorderClient(endpoint) as client:
        (booked,) = await client.list_runs(conversation_id="conv-booking")
    return result.run_id, booked.run_id


async def test_the_documented_examples_answer_what_was_recorded(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    planner, booker = await _record_a_tree(recorder.endpoint)
    crashed = await asyncio.to_thread(spawn, "inside_tool", recorder.endpoint, "conv-crash")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    async def crash_adopted() -> bool:  # the rest of the killed biller's journal, delivered by the recorder
        runs = await client.list_runs(conversation_id="conv-crash")
        events = await client.list_events(runs[0].run_id) if runs else []
        return any(e.kind == "tool_call_started" and e.tool_call_id == "c1" for e in events)

    assert await eventually(crash_adopted)
    assert set(EXAMPLES) == {"tool-failure-rate", "slowest-model-requests", "unresolved-effects",
                             "usage-per-conversation"}  # fmt: skip

    rates = (await client.sql(EXAMPLES["tool-failure-rate"].replace("ROOT_RUN_ID", planner))).to_pylist()
    assert rates == [
        {"tool_name": "book", "calls": 1, "failed": 1, "failure_rate": 1.0},
        {"tool_name": "delegate", "calls": 1, "failed": 0, "failure_rate": 0.0},
        {"tool_name": "weather", "calls": 2, "failed": 0, "failure_rate": 0.0},
    ]

    slowest = (await client.sql(EXAMPLES["slowest-model-requests"])).to_pylist()
    expected = {}  # every model request of every run, timed from its events
    for run in await client.list_runs():
        started = {}
        for event in await client.list_events(run.run_id):
            if event.kind == "model_request_started":
                started[event.step_index] = event.timestamp
            elif event.kind == "model_request_completed":
                took = (event.timestamp - started[event.step_index]).total_seconds() * 1000
                expected[(run.run_id, event.step_index)] = took
    assert len(expected) == 7  # planner 4, booker 1, biller 2 (killed inside its second tool call)
    assert {(row["run_id"], row["step_index"]): row["duration_ms"] for row in slowest} == pytest.approx(expected)
    assert [row["duration_ms"] for row in slowest] == pytest.approx(sorted(expected.values(), reverse=True))

    (unresolved,) = (await client.sql(EXAMPLES["unresolved-effects"])).to_pylist()
    (biller,) = await client.list_runs(conversation_id="conv-crash")
    assert unresolved == {"run_id": biller.run_id, "agent_name": "biller", "outcome": "running", "unresolved": 1,
                          "calls": ["charge c1"]}  # fmt: skip

    usage = {row["conversation_id"]: row for row in (await client.sql(EXAMPLES["usage-per-conversation"])).to_pylist()}
    assert set(usage) == {"conv-trip", "conv-booking", "conv-crash"}
    assert (usage["conv-trip"]["runs"], usage["conv-trip"]["model_requests"]) == (1, 4)
    assert (usage["conv-booking"]["runs"], usage["conv-booking"]["model_requests"]) == (1, 1)
    trip = await client.latest_snapshot(planner)
    expected_input = sum(m.usage.input_tokens for m in trip.messages if isinstance(m, ModelResponse))
    assert usage["conv-trip"]["input_tokens"] == expected_input > 0
    assert booker in {row["run_id"] for row in (await client.sql("SELECT run_id FROM runs")).to_pylist()}


async def test_every_view_answers_and_run_tree_pairs_runs_with_descendants(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    planner, booker = await _record_a_tree(recorder.endpoint)
    for view in ("runs", "events", "snapshots", "snapshot_messages", "messages", "tool_effects",
                 "tool_effect_records", "run_tree"):  # fmt: skip
        assert (await client.sql(f"SELECT count(*) AS n FROM {view}")).column("n")[0].as_py() > 0, view
    tree = (await client.sql(f"SELECT run_id, depth, relation FROM run_tree WHERE root_run_id = '{planner}'"
                             " ORDER BY depth")).to_pylist()  # fmt: skip
    assert tree == [
        {"run_id": planner, "depth": 0, "relation": "self"},
        {"run_id": booker, "depth": 1, "relation": "child"},
    ]
    # The columnar tree read agrees, with each run's outcome.
    below = await client.descendants(planner)
    assert below.select(["run_id", "depth", "parent_run_id", "outcome"]).to_pylist() == [
        {"run_id": planner, "depth": 0, "parent_run_id": None, "outcome": "completed"},
        {"run_id": booker, "depth": 1, "parent_run_id": planner, "outcome": "failed"},
    ]
    assert await client.descendants("never-recorded") is None
    # snapshot_messages rebuilds exactly what a snapshot read returns.
    newest = await client.latest_snapshot(planner)
    rows = (await client.sql(
        f"SELECT position, message FROM snapshot_messages WHERE run_id = '{planner}'"
        f" AND snapshot_index = {newest.snapshot_index} ORDER BY position"
    )).to_pylist()  # fmt: skip
    assert [row["position"] for row in rows] == list(range(len(newest.messages)))
    assert [json.loads(row["message"])["kind"] for row in rows] == [m.kind for m in newest.messages]


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("INSERT INTO runs VALUES ('x')", "only SELECT"),
        ("DELETE FROM main.events", "only SELECT"),
        ("CREATE TABLE t AS SELECT 1", "only SELECT"),
        ("ATTACH '/tmp/other.duckdb'", "only SELECT"),
        ("COPY main.runs TO '/tmp/runs.csv'", "only SELECT"),
        ("INSTALL httpfs", "only SELECT"),
        ("LOAD httpfs", "only SELECT"),
        ("SET threads = 1", "only SELECT"),
        ("PRAGMA enable_profiling", "only SELECT"),
        ("EXPORT DATABASE '/tmp/steprec-export'", "only SELECT"),
        ("CALL checkpoint()", "only SELECT"),
        ("SELECT 1; DROP TABLE main.runs", "exactly one statement"),
        ("SELECT * FROM read_csv('/etc/passwd')", "Permission Error"),
        ("SELECT * FROM read_text('/etc/hostname')", "Permission Error"),
        ("SELECT * FROM glob('/*')", "Permission Error"),
        ("SELECT * FROM read_parquet('https://example.com/x.parquet')", "Permission Error"),
        ("SELECT * FROM no_such_view", "no_such_view"),
        ("SELEC 1", "does not parse"),
        ("", "empty"),
    ],
)
async def test_anything_but_a_read_is_refused_with_its_reason(shared_recorder: RecorderProcess, query: str,
                                                              reason: str) -> None:  # fmt: skip
    async with RecorderClient(shared_recorder.endpoint) as client:
        with pytest.raises(ValueError, match=re.escape(reason)):
            await client.sql(query)
        # ... and the recorder keeps answering, its tables intact.
        assert (await client.sql("SELECT count(*) AS n FROM main.runs")).column("n")[0].as_py() == 0


@pytest.fixture(scope="module")
def shared_recorder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecorderProcess]:
    """One recorder for many refusals: each must leave it serving the next."""
    process = RecorderProcess(tmp_path_factory.mktemp("shared") / "recorder").start()
    try:
        yield process
    finally:
        process.stop()


async def test_rows_are_cut_off_and_long_queries_interrupted(recorder: RecorderProcess, client: RecorderClient) -> None:
    table = await client.sql("SELECT range AS n FROM range(100000)", max_rows=2500)
    assert table.num_rows == 2500 and truncated(table) and table.column("n").to_pylist() == list(range(2500))
    exact = await client.sql("SELECT range AS n FROM range(2500)", max_rows=2500)
    assert exact.num_rows == 2500 and not truncated(exact)
    empty = await client.sql("SELECT run_id FROM runs")
    assert empty.num_rows == 0 and empty.column_names == ["run_id"] and not truncated(empty)
    with pytest.raises(TimeoutError, match="1 s time limit"):
        await client.sql("SELECT count(*) FROM range(1000000000000) a", timeout_seconds=1)
    # A limit so small it passed before the query started: that interrupt was lost and the query ran forever.
    endless = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"
    with pytest.raises(TimeoutError, match="time limit"):
        await asyncio.wait_for(client.sql(endless, timeout_seconds=1e-9), 20)
    with pytest.raises(ValueError, match="max_rows must be"):
        await client.sql("SELECT 1", max_rows=10_000_000)
    # An interrupted query leaves the recorder serving, and a write path untouched.
    await (Agent(_scripted("hi"), name="after", capabilities=[StepRecorder(endpoint=recorder.endpoint)])).run("x")
    assert (await client.sql("SELECT agent_name FROM runs")).column("agent_name").to_pylist() == ["after"]


async def test_media_is_fetched_by_its_uri(recorder: RecorderProcess, client: RecorderClient) -> None:
    from pydantic_ai.messages import BinaryContent

    image = bytes(range(256)) * 8000  # 2 MB: several chunks
    agent = Agent(_scripted("seen"), name="viewer", capabilities=[StepRecorder(endpoint=recorder.endpoint)])
    await agent.run(["look", BinaryContent(data=image, media_type="image/png")])
    (uri,) = (await client.sql(
        "SELECT DISTINCT regexp_extract(message, 'media\\+sha256://[0-9a-f]{64}') AS uri FROM messages"
        " WHERE message LIKE '%media+sha256://%'"
    )).column("uri").to_pylist()  # fmt: skip
    assert await client.fetch_media(uri) == image
    with pytest.raises(LookupError):
        await client.fetch_media("media+sha256://" + "0" * 64)
    with pytest.raises(ValueError, match="is not media"):
        await client.fetch_media("media+sha256://../../etc/passwd")


def _steprec(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "steprec.query.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


async def test_steprec_sql_prints_table_csv_json_and_writes_parquet(recorder: RecorderProcess, tmp_path: Path) -> None:
    await _record_a_tree(recorder.endpoint)
    query = "SELECT agent_name, outcome FROM runs ORDER BY agent_name"
    at = ("--endpoint", recorder.endpoint)
    target = tmp_path / "runs.parquet"
    table, csv_out, written, cut, refused = await asyncio.gather(  # separate processes, run side by side
        asyncio.to_thread(_steprec, "sql", query, *at),
        asyncio.to_thread(_steprec, "sql", query, "--format", "csv", *at),
        asyncio.to_thread(_steprec, "sql", "SELECT * FROM runs", "--format", "parquet", "--output", str(target), *at),
        asyncio.to_thread(_steprec, "sql", "SELECT range AS n FROM range(50)", "--max-rows", "10", "--json", *at),
        asyncio.to_thread(_steprec, "sql", "DROP TABLE main.runs", *at),
    )
    assert table.returncode == 0 and "booker" in table.stdout and "2 rows" in table.stdout, table.stderr
    assert csv_out.stdout.splitlines() == ["agent_name,outcome", "booker,failed", "planner,completed"]
    assert written.returncode == 0 and pq.read_table(target).num_rows == 2
    assert json.loads(cut.stdout) == [{"n": n} for n in range(10)] and "cut off after 10 rows" in cut.stderr
    assert refused.returncode == 2 and "only SELECT" in refused.stderr and "Traceback" not in refused.stderr


async def test_export_parquet_is_partitioned_by_day_and_reads_back(
    recorder: RecorderProcess, client: RecorderClient, tmp_path: Path
) -> None:
    assert set(EXPORT_TABLES) == set(EXPORTS)  # the CLI asks for exactly what the recorder serves
    await _record_a_tree(recorder.endpoint)
    await ConversationStore(client).save(summary=ConversationSummary(workspace="/w"), messages=[])
    out = tmp_path / "export"
    done = await asyncio.to_thread(_steprec, "export", "parquet", str(out), "--endpoint", recorder.endpoint, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    for name in EXPORT_TABLES:
        dataset = ds.dataset(out / name, format="parquet", partitioning="hive")
        table = dataset.to_table()
        expected = (await client.sql(f"SELECT count(*) AS n FROM ({EXPORTS[name][0]})")).column("n")[0].as_py()
        assert table.num_rows == summary[name]["rows"] == expected > 0, name
        if EXPORTS[name][1] is not None:
            days = {str(day) for day in table.column("day").unique().to_pylist()}
            stamps = table.column(EXPORTS[name][1]).to_pylist()
            assert days == {stamp.astimezone(UTC).date().isoformat() for stamp in stamps}
            assert all((out / name / f"day={day}" / "part-0.parquet").exists() for day in days)
    again = await asyncio.to_thread(_steprec, "export", "parquet", str(out), "--endpoint", recorder.endpoint)
    assert again.returncode == 2 and "--overwrite" in again.stderr


@pytest.mark.parametrize("size", [1, 127, 128, 16_384, 1 << 20, (1 << 20) + 1, 5 << 19])
def test_arrow_chunks_encoded_ahead_are_what_protobuf_writes(size: int) -> None:
    """The servicer writes ArrowChunk messages itself (one copy of each piece); clients parse them with protobuf."""
    stream = pa.py_buffer(bytes(range(256)) * (size // 256) + bytes(size % 256))
    encoded = list(encoded_arrow_chunks(stream))
    pieces = [stream[start : start + (1 << 20)].to_pybytes() for start in range(0, size, 1 << 20)]
    assert encoded == [
        pb.ArrowChunk(arrow_ipc=piece, batch_end=n == len(pieces) - 1).SerializeToString()
        for n, piece in enumerate(pieces)
    ]
    assert b"".join(pb.ArrowChunk.FromString(chunk).arrow_ipc for chunk in encoded) == stream.to_pybytes()
