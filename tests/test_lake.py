"""Lake mode: three recorders (separate processes) share one DuckLake, its catalog in a real PostgreSQL and its
data on moto's S3 server; agents record through each, and every read is asked of the others."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import duckdb
import grpc
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from steprec.exporter import StepRecorder, _records, shutdown_pipelines
from steprec.exporter._otlp import RequestEnvelope
from steprec.proto import wire
from steprec.query import (
    ConversationConflict,
    ConversationStore,
    ConversationSummary,
    RecorderClient,
    continue_run,
    fork_run,
)
from steprec.recorder.daemon.process import RecorderProcess
from steprec.recorder.lake.retry import on_conflict

from .agents import echo_agent, tool_returns
from .crash_agent import eventually
from .export_switch import ExportSwitch
from .lake_services import free_port, postgres, s3_server
from .test_conversations import turn

FRESH_SECONDS = 2.0
"""Issue 22: any recorder answers for records another acknowledged at most this long ago."""
MAINTAIN_SECONDS = 3
DOCS = Path(__file__).resolve().parent.parent / "docs" / "lake.md"
DOCS_CATALOG, DOCS_ENDPOINT = "postgres:dbname=steprec_lake host=127.0.0.1 user=steprec", "127.0.0.1:9000"


def _docs_sql() -> str:
    """The plain-DuckDB example of docs/lake.md: the first ```sql block after its marker."""
    text = DOCS.read_text()
    return text[text.index("<!-- plain-duckdb -->") :].split("```sql", 1)[1].split("```", 1)[0]


class Lake:
    def __init__(self, catalog: str, s3_endpoint: str, folder: Path) -> None:
        self.catalog, self.s3_endpoint, self.folder = catalog, s3_endpoint, folder
        self.recorders = [self.recorder(f"recorder-{i}") for i in range(3)]

    def args(self) -> tuple[str, ...]:
        return ("--lake", self.catalog, "--lake-data", "s3://steprec/lake", "--s3-endpoint-url", self.s3_endpoint,
                "--lake-maintain-seconds", str(MAINTAIN_SECONDS))  # fmt: skip

    def plain_duckdb(self) -> duckdb.DuckDBPyConnection:
        """The lake attached the way docs/lake.md shows, in plain DuckDB: no steprec code. The docs' INSTALL lines
        fetch the extensions from the network; here they come from the PyPI wheels the recorder uses."""
        connection = self.duckdb_with_extensions()
        endpoint = self.s3_endpoint.removeprefix("http://")
        for statement in _docs_sql().split(";"):
            statement = statement.strip().replace(DOCS_CATALOG, self.catalog).replace(DOCS_ENDPOINT, endpoint)
            if statement.startswith(("ATTACH", "CREATE SECRET", "LOAD")):
                connection.execute(statement.replace("'minio'", "'testing'"))
        return connection

    def duckdb_with_extensions(self) -> duckdb.DuckDBPyConnection:
        connection = duckdb.connect(config={"autoinstall_known_extensions": "false",
                                            "extension_directory": str(self.folder / "plain-extensions")})  # fmt: skip
        for package in ("ducklake", "postgres", "httpfs"):
            found = importlib.util.find_spec(f"duckdb_extension_{package}").submodule_search_locations[0]
            connection.execute(f"INSTALL '{next(Path(found).rglob('*.duckdb_extension'))}'")
        return connection

    def recorder(self, name: str, listen: str = "127.0.0.1:0") -> RecorderProcess:
        return RecorderProcess(self.folder / name, listen=listen, ui_listen="off", extra_args=self.args())


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    with postgres() as pg, s3_server("steprec") as s3:
        lake = Lake(f"postgres:{pg}", s3, tmp_path_factory.mktemp("lake"))
        for recorder in lake.recorders:
            recorder.start(timeout=60)
        try:
            yield lake
        finally:
            shutdown_pipelines()
            for recorder in lake.recorders:
                recorder.stop()


async def _seen_within(read, seconds: float = FRESH_SECONDS):
    """`read()` until it answers something, failing if that takes more than `seconds`."""
    started = time.monotonic()
    value = await eventually(read, seconds=seconds)
    assert value, f"not seen within {seconds} s"
    return value, time.monotonic() - started


async def test_every_recorder_answers_every_read_for_runs_recorded_through_another(lake: Lake) -> None:
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    results = []
    for recorder in lake.recorders:  # one run through each recorder, in one conversation
        results.append(await echo_agent(recorder.endpoint, calls=3).run("go", conversation_id=conversation))
    run_ids = {result.run_id for result in results}
    for reader in lake.recorders:
        async with RecorderClient(reader.endpoint) as client:

            async def whole_conversation(client=client):
                runs = await client.list_runs(conversation_id=conversation)
                return {r.run_id for r in runs} == run_ids and all(r.outcome == "completed" for r in runs)

            await _seen_within(whole_conversation)
            for result in results:
                events = await client.list_events(result.run_id)
                assert [e.kind for e in events][0] == "run_started" and events[-1].kind == "run_completed"
                assert len({e.idempotency_key for e in events}) == len(events)  # each stored once
                history = await continue_run(client, run_id=result.run_id)
                assert [type(m) for m in history] == [type(m) for m in result.all_messages()]
                assert len(await client.list_tool_effects(result.run_id)) >= 3
            table = await client.sql(
                "SELECT count(*) AS runs FROM recorded.runs WHERE conversation_id = '" + conversation + "'"
            )
            assert table.column("runs").to_pylist() == [3]


async def test_a_fork_recorded_through_one_recorder_is_in_the_tree_read_from_another(lake: Lake) -> None:
    first, second, third = lake.recorders
    origin = await echo_agent(first.endpoint, calls=2).run("go", conversation_id="conv-fork-origin")
    async with RecorderClient(second.endpoint) as client:
        await _seen_within(lambda: client.latest_snapshot(origin.run_id))
        history = await fork_run(client, run_id=origin.run_id, at=1)
    fork = await echo_agent(second.endpoint, calls=3).run(message_history=history, metadata=history.metadata)
    async with RecorderClient(third.endpoint) as client:

        async def tree():
            found = await client.run_tree(origin.run_id)
            return found if found and any(c.run.run_id == fork.run_id for c in found.children) else None

        await _seen_within(tree)


async def test_an_explicit_run_id_is_single_use_across_the_fleet(lake: Lake) -> None:
    run_id = f"run-{uuid.uuid4().hex}"
    first, second, _ = lake.recorders
    await echo_agent(first.endpoint, calls=1).run("go", run_id=run_id)
    with pytest.raises(ValueError, match="run_id"):
        await echo_agent(second.endpoint, calls=1).run("go", run_id=run_id)


def _registration(run_id: str, registration_id: str) -> logs_service_pb2.ExportLogsServiceRequest:
    scope = _records.RunScope(run_id, "conv-claims", None, "claims")
    record = _records.step_event(scope, "run_started", step_index=0, idempotency_key="0:0:run_started:",
                                 registration_id=registration_id)  # fmt: skip
    return logs_service_pb2.ExportLogsServiceRequest.FromString(
        RequestEnvelope({}, "steprec.exporter", "test").request([record.data])
    )


async def test_a_retried_registration_is_accepted_by_another_recorder_and_a_rival_one_refused(lake: Lake) -> None:
    """The same registration sent again (its answer was lost) through a second recorder stays accepted, once the
    first recorder's log is in the lake (until then it is UNAVAILABLE, which the agent's journal retries, as
    here); a different registration of the same run id, sent through the third, is refused at once."""
    run_id, registration = f"run-{uuid.uuid4().hex}", str(uuid.uuid4())
    answers = []
    for recorder, sent in zip(lake.recorders, (registration, registration, str(uuid.uuid4())), strict=True):
        async with grpc.aio.insecure_channel(recorder.endpoint) as channel:
            stub = logs_service_pb2_grpc.LogsServiceStub(channel)
            deadline = time.monotonic() + FRESH_SECONDS
            while True:
                try:
                    answers.append(await stub.Export(_registration(run_id, sent), timeout=10))
                    break
                except grpc.aio.AioRpcError as error:
                    if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
    assert [a.partial_success.rejected_log_records for a in answers] == [0, 0, 1]
    assert wire.REFUSED_RUN_ID_TAKEN in answers[2].partial_success.error_message
    async with grpc.aio.insecure_channel(lake.recorders[0].endpoint) as channel:  # PostgreSQL's text holds no NUL
        request = _registration(f"run-{uuid.uuid4().hex}", "bad\x00registration")
        request.MergeFrom(_registration(f"run-{uuid.uuid4().hex}", str(uuid.uuid4())))
        answer = await logs_service_pb2_grpc.LogsServiceStub(channel).Export(request, timeout=10)
    assert answer.partial_success.rejected_log_records == 1 and "NUL" in answer.partial_success.error_message


def _moving_agent(
    endpoint: str, steps: int, at_step: dict[int, Callable[[], Awaitable[None]]], keep: int | None = None
) -> Agent:
    """An agent calling its tool `steps` times, a step every 0.1 s (so its journal sends between steps); before
    step k it awaits `at_step[k]()`: where a test moves its records to another recorder. `keep`: the run's
    retention (max_snapshots_per_run)."""

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = len(tool_returns(messages))
        if done in at_step:
            await at_step.pop(done)()
        await asyncio.sleep(0.1)
        if done < steps:
            return ModelResponse(parts=[ToolCallPart("echo", {"text": f"call {done}"}, tool_call_id=f"call-{done}")])
        return ModelResponse(parts=[TextPart(f"saw {done} returns")])

    agent = Agent(
        FunctionModel(model), name="mover", capabilities=[StepRecorder(endpoint=endpoint, max_snapshots_per_run=keep)]
    )

    @agent.tool_plain
    def echo(text: str) -> str:
        return f"echo: {text}" + "." * 2000

    return agent


async def _stored_once_and_whole(reader: RecorderProcess, result, steps: int, kept: int | None = None) -> None:
    """The run as `reader` has it, within 20 s: ended, every event once, as many as a run of `steps` tool calls
    recorded straight to one recorder makes, every tool call resolved, its history the agent's own, and `kept`
    snapshots left by its retention."""
    async with RecorderClient(reader.endpoint) as client:

        async def ended():
            runs = await client.list_runs(conversation_id=result.conversation_id)
            return runs and runs[0].outcome == "completed"

        await _seen_within(ended, seconds=20)
        events = await client.list_events(result.run_id)
        assert len({e.idempotency_key for e in events}) == len(events)  # each stored once
        kinds = [e.kind for e in events]
        assert kinds[0] == "run_started" and kinds[-1] == "run_completed"
        assert kinds.count("tool_call_started") == kinds.count("tool_call_completed") == steps
        effects = await client.list_tool_effects(result.run_id)
        assert len(effects) == steps and {e.status for e in effects} == {"completed"}
        history = await continue_run(client, run_id=result.run_id)
        assert ModelMessagesTypeAdapter.dump_python(history) == ModelMessagesTypeAdapter.dump_python(
            result.all_messages()
        )
        rows = await client.sql(
            f"SELECT count(*) AS n FROM recorded.runs WHERE run_id = '{result.run_id}'"  # one runs row
        )
        assert rows.column("n").to_pylist() == [1]
        if kept is not None:
            rows = await client.sql(f"SELECT count(*) AS n FROM recorded.snapshots WHERE run_id = '{result.run_id}'")
            assert rows.column("n").to_pylist() == [kept]


async def test_a_run_moving_between_recorders_mid_run_is_stored_whole_and_once(lake: Lake) -> None:
    """The agent's records go to the first recorder, then (the answer to one Export lost on the way, so the
    agent sends it again) to the second, then back to the first: each waits for the other's log to reach the
    lake before it takes the run, and the third reads it whole, with the run's retention kept across the moves."""
    first, second, third = lake.recorders
    steps = 10
    with ExportSwitch(first.endpoint) as switch:

        async def to_second() -> None:
            switch.send_to(second.endpoint, lose_next_answer=True)

        async def back_to_first() -> None:  # once the second has taken the run (the journal retries with backoff)
            await eventually(lambda: asyncio.sleep(0, switch.answered[second.endpoint]), seconds=20)
            switch.send_to(first.endpoint)

        agent = _moving_agent(switch.endpoint, steps, {3: to_second, 7: back_to_first}, keep=3)
        result = await agent.run("go", conversation_id=f"conv-move-{uuid.uuid4().hex[:8]}")
        await _stored_once_and_whole(third, result, steps, kept=3)  # the switch stays: the journal may still send
    assert switch.answered[second.endpoint] and switch.answered[first.endpoint] >= 2
    assert any("moved here from another recorder" in refusal for refusal in switch.refusals)


async def test_a_run_whose_first_recorder_is_killed_mid_run_waits_for_its_log_and_is_stored_whole(
    lake: Lake,
) -> None:
    """The first recorder is SIGKILLed with the run's acknowledged records in its log; the run goes on through
    the second, which holds its records back (the agent's journal keeps them) until the first is restarted and
    has applied its log."""
    victim = lake.recorder("handoff-victim", listen=f"127.0.0.1:{free_port()}")
    victim.start(timeout=60)
    second, third = lake.recorders[1], lake.recorders[2]
    steps = 10
    try:
        with ExportSwitch(victim.endpoint) as switch:

            async def kill_first() -> None:
                victim.process.send_signal(signal.SIGKILL)
                victim.process.wait()
                switch.send_to(second.endpoint)

            async def restart_first() -> None:
                await asyncio.to_thread(victim.start, 60)  # same data folder: it applies its log

            agent = _moving_agent(switch.endpoint, steps, {4: kill_first, 6: restart_first})
            result = await agent.run("go", conversation_id=f"conv-kill-{uuid.uuid4().hex[:8]}")
            await _stored_once_and_whole(third, result, steps)
        assert any("moved here from another recorder" in refusal for refusal in switch.refusals)
    finally:
        victim.stop()


async def test_a_conversation_head_is_one_compare_and_swap_across_recorders(lake: Lake) -> None:
    """Saves of one revision through every recorder at once: exactly one commits, the others are conflicts, and
    every recorder reads the one that did."""
    stores = [ConversationStore(recorder.endpoint) for recorder in lake.recorders]
    try:
        first = await stores[0].save(summary=ConversationSummary(workspace="/w"), messages=turn("hi", "hello"))
        outcomes = await asyncio.gather(
            *(store.save(summary=first, messages=turn("hi", "hello") + turn(f"from {i}", "ok"))
              for i, store in enumerate(stores)),
            return_exceptions=True,
        )  # fmt: skip
        saved = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
        assert len(saved) == 1 and saved[0].revision == 2, outcomes
        assert all(isinstance(o, ConversationConflict) for o in outcomes if o is not saved[0]), outcomes
        for store in stores:
            head = await store.get(conversation_id=first.id)
            assert head.summary.revision == 2 and len(head.messages) == 4
    finally:
        for store in stores:
            await store.close()


async def test_the_sql_of_a_stranger_cannot_reach_the_catalog_database(lake: Lake) -> None:
    async with RecorderClient(lake.recorders[0].endpoint) as client:
        for query in (
            "SELECT * FROM postgres_query('__ducklake_metadata_lake', 'SELECT 1')",
            "SELECT * FROM ducklake_snapshots('lake')",
        ):
            with pytest.raises(ValueError, match="refused|not allowed|does not exist"):
                await client.sql(query)
        assert (await client.sql("SELECT count(*) AS n FROM recorded.runs")).num_rows == 1


def _load(endpoint: str, stop: Path, conversation: str) -> subprocess.Popen[str]:
    """An agent process recording short runs back to back through `endpoint` until `stop` exists; prints each
    run id once its run has returned (so it is acknowledged)."""
    script = (
        "import asyncio, pathlib, sys\n"
        "from tests.agents import echo_agent\n"
        "async def main():\n"
        "    while not pathlib.Path(sys.argv[2]).exists():\n"
        "        result = await echo_agent(sys.argv[1], calls=2).run('go', conversation_id=sys.argv[3])\n"
        "        print(result.run_id, flush=True)\n"
        "asyncio.run(main())\n"
    )
    root = Path(__file__).resolve().parent.parent
    return subprocess.Popen([sys.executable, "-c", script, endpoint, str(stop), conversation], cwd=root,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(root)})  # fmt: skip


async def test_a_recorder_killed_under_load_loses_nothing_and_stores_nothing_twice(lake: Lake, tmp_path: Path) -> None:
    victim = lake.recorder("victim", listen=f"127.0.0.1:{free_port()}")  # restarted where its agents send
    victim.start(timeout=60)
    stop, conversation = tmp_path / "stop", f"conv-load-{uuid.uuid4().hex[:8]}"
    loads = [_load(victim.endpoint, stop, conversation), _load(lake.recorders[0].endpoint, stop, conversation)]
    await asyncio.sleep(6)
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait()
    async with RecorderClient(lake.recorders[1].endpoint) as client:  # the others serve on
        assert await client.list_runs(conversation_id=conversation)
    await asyncio.sleep(2)  # the victim's agents keep journaling while it is down
    victim.start(timeout=60)  # same data folder: it applies its log, then its agents deliver their journals
    await asyncio.sleep(2)
    stop.touch()
    acknowledged = set()
    for load in loads:
        out, _ = load.communicate(timeout=60)
        acknowledged.update(out.split())
    try:
        async with RecorderClient(lake.recorders[2].endpoint) as client:

            async def all_there():
                runs = await client.list_runs(conversation_id=conversation)
                return acknowledged <= {r.run_id for r in runs if r.outcome == "completed"} and runs

            runs = await _seen_within(all_there, seconds=10)
            runs = runs[0]
            assert len(runs) == len({r.run_id for r in runs})  # one runs row each
            duplicated = await client.sql(
                "SELECT count(*) AS n FROM (SELECT run_id, idempotency_key FROM recorded.events"
                f" WHERE conversation_id = '{conversation}' GROUP BY ALL HAVING count(*) > 1)"
            )
            assert duplicated.column("n").to_pylist() == [0]
    finally:
        victim.stop()
    assert len(acknowledged) > 10


def test_bad_lake_settings_are_refused_with_the_reason(tmp_path: Path) -> None:
    def serve(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "steprec.recorder", "serve", "--data", str(tmp_path), "--ui-listen", "off", *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode != 0
        return done.stderr

    assert "go together" in serve("--lake", "postgres:dbname=x")
    assert "not a DuckLake catalog" in serve("--lake", "mysql://x", "--lake-data", str(tmp_path / "d"))
    assert "needs a bucket and a prefix" in serve("--lake", "postgres:dbname=x", "--lake-data", "s3://bucket")
    refused = serve("--lake", "postgres:dbname=x host=127.0.0.1 port=1 password=hunter2", "--lake-data",
                    str(tmp_path / "d"))  # fmt: skip
    assert "cannot attach the lake" in refused and "hunter2" not in refused


async def test_plain_duckdb_reads_the_lake_as_docs_lake_md_shows(lake: Lake) -> None:
    result = await echo_agent(lake.recorders[0].endpoint, calls=1).run("go", conversation_id="conv-plain")
    async with RecorderClient(lake.recorders[0].endpoint) as client:
        await _seen_within(lambda: client.sql("SELECT 1 FROM recorded.runs WHERE conversation_id = 'conv-plain'"))
    reader = lake.plain_duckdb()
    try:
        queries = [q.strip() for q in _docs_sql().split(";") if q.strip().startswith("SELECT")]
        assert queries
        for query in queries:
            assert reader.execute(query).to_arrow_table().num_rows  # Arrow: no pytz for the timestamps
        kinds = reader.execute("SELECT kind FROM lake.events WHERE run_id = ? ORDER BY write_seq", [result.run_id])
        assert [k for (k,) in kinds.fetchall()][-1] == "run_completed"
    finally:
        reader.close()


async def test_prune_works_on_the_lake_and_frees_the_run_ids(lake: Lake) -> None:
    run_id, conversation = f"run-{uuid.uuid4().hex}", f"conv-prune-{uuid.uuid4().hex[:8]}"
    first, second, third = lake.recorders
    await echo_agent(first.endpoint, calls=2).run("go", run_id=run_id, conversation_id=conversation)
    async with RecorderClient(second.endpoint) as client:
        await _seen_within(lambda: client.list_runs(conversation_id=conversation))
        removed = await client.prune(conversation_id=conversation)
    assert removed["runs"] == 1 and removed["events"] >= 4
    async with RecorderClient(third.endpoint) as client:

        async def gone():
            return not await client.list_runs(conversation_id=conversation)

        await _seen_within(gone)
    # Pruned, its id may be registered again (as in file mode), through any recorder.
    await echo_agent(third.endpoint, calls=1).run("again", run_id=run_id, conversation_id=conversation)


def test_a_commit_postgresql_ends_as_a_deadlock_is_redone_whole(lake: Lake) -> None:
    """A prune's deletes of inlined catalog rows once deadlocked with another recorder's round (CI, stop 35):
    PostgreSQL rolls one back with "deadlock detected", a lost race like any other, so `on_conflict` redoes it.
    Two real transactions through DuckDB's postgres extension take two rows in opposite orders."""
    connections = [lake.duckdb_with_extensions() for _ in range(2)]
    for connection in connections:
        connection.execute("LOAD postgres")
        connection.execute(f"ATTACH '{lake.catalog.removeprefix('postgres:')}' AS pg (TYPE postgres)")
    table = f"pg.public.deadlock_{uuid.uuid4().hex[:8]}"
    connections[0].execute(f"CREATE TABLE {table} (id INTEGER, bumps INTEGER)")
    connections[0].execute(f"INSERT INTO {table} VALUES (1, 0), (2, 0)")
    both_hold_their_first_row, attempts = threading.Barrier(2, timeout=30), [0, 0]

    def bump_both(which: int) -> None:
        connection, order = connections[which], (1, 2) if which == 0 else (2, 1)

        def attempt() -> None:
            attempts[which] += 1
            connection.execute("BEGIN")
            try:
                connection.execute(f"UPDATE {table} SET bumps = bumps + 1 WHERE id = {order[0]}")
                if attempts[which] == 1:
                    both_hold_their_first_row.wait()
                connection.execute(f"UPDATE {table} SET bumps = bumps + 1 WHERE id = {order[1]}")
                connection.execute("COMMIT")
            except duckdb.Error:
                connection.execute("ROLLBACK")
                raise

        on_conflict(attempt)

    try:
        workers = [threading.Thread(target=bump_both, args=(which,)) for which in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=60)
        assert sorted(attempts) == [1, 2], attempts  # PostgreSQL rolled one back; it was redone once
        assert connections[0].execute(f"SELECT id, bumps FROM {table} ORDER BY id").fetchall() == [(1, 2), (2, 2)]
    finally:
        for connection in connections:
            connection.close()


def _quiet(reader: duckdb.DuckDBPyConnection, seconds: float = 2.0) -> None:
    """Wait (up to 30 s) until no recorder has committed to the lake for `seconds`."""
    newest = "SELECT max(snapshot_id) FROM __ducklake_metadata_lake.ducklake_snapshot"
    deadline, last, since = time.monotonic() + 30, None, time.monotonic()
    while time.monotonic() - since < seconds:
        assert time.monotonic() < deadline, "the recorders kept committing"
        if (current := reader.execute(newest).fetchone()[0]) != last:
            last, since = current, time.monotonic()
        time.sleep(0.2)


async def test_small_files_stay_bounded_under_steady_ingest(lake: Lake, tmp_path: Path) -> None:
    """Every applier commit adds files; the recorders' scheduled maintenance merges them, and
    `steprec lake maintain` does it on demand."""
    reader = lake.plain_duckdb()
    files = "__ducklake_metadata_lake.ducklake_data_file"  # DuckLake's own catalog tables, as docs attach it

    def live() -> int:
        return reader.execute(f"SELECT count(*) FROM {files} WHERE end_snapshot IS NULL").fetchone()[0]

    stop = tmp_path / "stop"
    loads = [_load(recorder.endpoint, stop, "conv-files") for recorder in lake.recorders]
    counts = []
    for _ in range(5 * MAINTAIN_SECONDS):
        await asyncio.sleep(1)
        counts.append(live())
    stop.touch()
    for load in loads:
        load.communicate(timeout=60)
    try:
        assert min(counts[len(counts) // 2 :]) < max(counts), counts  # merged while ingest went on
        _quiet(reader)  # the appliers' last commits after the loads ended would add files after the merge
        done = subprocess.run(
            [sys.executable, "-m", "steprec.recorder", "lake", "maintain", "--lake", lake.catalog, "--lake-data",
             "s3://steprec/lake", "--s3-endpoint-url", lake.s3_endpoint, "--keep-seconds", "1"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "data files" in done.stdout
        tables = reader.execute(f"SELECT count(DISTINCT table_id) FROM {files} WHERE end_snapshot IS NULL").fetchone()[
            0
        ]
        per_table = reader.execute(
            f"SELECT table_id, count(*), sum(record_count) FROM {files} WHERE end_snapshot IS NULL GROUP BY ALL"
        ).fetchall()
        assert live() <= 2 * tables, (live(), tables, counts, per_table, done.stdout)
    finally:
        reader.close()
