"""The journal delivery mode (issue 18): bad settings refused at construction, a tool's ModelRetry recorded as
`failed`, a full journal that does not cost the run its later snapshots, and kills that the journal survives."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from steprec.exporter import StepRecorder, _records, shutdown_pipelines
from steprec.exporter._journal import Journal
from steprec.exporter._otlp import RequestEnvelope
from steprec.proto.framing import append_frame
from steprec.query import RecorderClient
from steprec.recorder.daemon.process import RecorderProcess

from . import resume_agent
from .agents import echo_agent, tool_returns
from .crash_agent import eventually

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"delivery": "fast"}, "delivery must be one of 'journal', 'acknowledged', 'best_effort', got 'fast'"),
        ({"journal_max_bytes": -1}, "journal_max_bytes must be an integer of at least 1 MiB"),
        ({"journal_max_bytes": 4096}, "journal_max_bytes must be an integer of at least 1 MiB"),
        ({"journal_max_bytes": "big"}, "journal_max_bytes must be an integer of at least 1 MiB"),
    ],
)
def test_bad_delivery_settings_are_refused_at_construction(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        StepRecorder(**options)


def test_a_journal_folder_of_another_user_or_a_file_is_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    if os.geteuid() == 0:
        os.chown(foreign, 65534, 65534)
        with pytest.raises(ValueError, match="belongs to uid 65534, not to this user"):
            StepRecorder(journal_dir=foreign)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="cannot be created|is not a folder"):
        StepRecorder(journal_dir=a_file / "journal")
    with pytest.raises(ValueError, match="is not a folder"):
        StepRecorder(journal_dir=a_file)


async def test_a_tool_that_asks_for_a_retry_is_recorded_as_failed(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    """pydantic-ai calls no error hook for ModelRetry: without `wrap_tool_execute` the call stayed `started`
    and a finished run listed it among the unresolved effects."""
    tries = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(tries) < 2:  # call-0 asks for a retry, call-1 succeeds
            return ModelResponse(parts=[ToolCallPart("flaky", {}, tool_call_id=f"call-{len(tries)}")])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), capabilities=[StepRecorder(endpoint=recorder.endpoint)])

    @agent.tool_plain(retries=3)
    def flaky() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise ModelRetry("try again with feeling")
        return "ok"

    result = await agent.run("go", conversation_id="conv-retry")
    assert result.output == "done"
    (run,) = await client.list_runs(conversation_id="conv-retry")
    assert await client.list_unresolved_tool_effects(run.run_id) == []
    first = await client.get_tool_effect(run.run_id, "call-0")
    assert first.status == "failed"
    events = await client.list_events(run.run_id)
    (failed,) = [e for e in events if e.kind == "tool_call_failed"]
    assert failed.tool_call_id == "call-0" and "try again with feeling" in failed.error
    assert ("tool_call_completed", "call-1") in [(e.kind, e.tool_call_id) for e in events]


async def test_after_a_drop_the_next_snapshot_goes_whole(recorder: RecorderProcess, client: RecorderClient) -> None:
    """A snapshot the journal dropped is the base the next delta would name; the recorder never got it, so
    the next snapshot must go whole, or every later snapshot of the run is refused."""
    agent = echo_agent(recorder.endpoint, calls=4)
    original, dropped = Journal.append, []

    def drop_the_first_snapshot(self: Journal, payload: bytes) -> int | None:
        # The journal's own path for a request that does not fit, for the first frame holding a snapshot.
        if b"steprec.snapshot" in payload and not dropped:
            dropped.append(payload)
            return self._drop(len(payload), "is full (test)")
        return original(self, payload)

    Journal.append = drop_the_first_snapshot
    try:
        result = await agent.run("go", conversation_id="conv-drop")
    finally:
        Journal.append = original
    assert len(dropped) == 1
    (run,) = await client.list_runs(conversation_id="conv-drop")
    snapshot = await client.latest_snapshot(run.run_id)
    assert snapshot is not None and len(snapshot.messages) == len(result.all_messages())


def _kill_child(endpoint: str, journal: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run `body` (an agent that SIGKILLs itself) in a new process that journals into `journal`."""
    script = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from pydantic_ai import Agent
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
        from pydantic_ai.models.function import FunctionModel
        from steprec.exporter import StepRecorder
        from tests.agents import tool_returns
        ENDPOINT, JOURNAL = {endpoint!r}, {str(journal)!r}
        """
    ) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


_KILLED_AFTER_A_TOOL_RETURNED = """
    def model(messages, info):
        if tool_returns(messages):
            os.kill(os.getpid(), signal.SIGKILL)  # the next step's model call: right after the tool returned
        return ModelResponse(parts=[ToolCallPart("pay", {}, tool_call_id="pay-1")])
    agent = Agent(FunctionModel(model), capabilities=[StepRecorder(endpoint=ENDPOINT, journal_dir=JOURNAL)])
    @agent.tool_plain
    def pay() -> str:
        return "paid 42"
    asyncio.run(agent.run("go", conversation_id="conv-killed-after-return"))
"""

_KILLED_INSIDE_A_TOOL = """
    def model(messages, info):
        return ModelResponse(parts=[ToolCallPart("pay", {}, tool_call_id="pay-1")])
    agent = Agent(FunctionModel(model), capabilities=[StepRecorder(endpoint=ENDPOINT, journal_dir=JOURNAL)])
    @agent.tool_plain
    def pay() -> str:
        os.kill(os.getpid(), signal.SIGKILL)
    asyncio.run(agent.run("go", conversation_id="conv-killed-in-tool"))
"""


async def test_killed_right_after_a_tool_returned_the_recorder_has_that_return_within_2_s(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    journal = Path(os.environ["STEPREC_JOURNAL_DIR"])  # the folder this loopback recorder adopts by default
    done = _kill_child(recorder.endpoint, journal, _KILLED_AFTER_A_TOOL_RETURNED)
    assert done.returncode == -signal.SIGKILL, done.stderr
    killed_at = time.monotonic()

    async def resumable():
        runs = await client.list_runs(conversation_id="conv-killed-after-return")
        return runs and await client.latest_snapshot(runs[0].run_id)

    snapshot = await eventually(resumable)
    assert time.monotonic() - killed_at < 2.5
    assert snapshot and snapshot.state == "complete"
    assert [p.content for p in tool_returns(snapshot.messages)] == ["paid 42"]
    (run,) = await client.list_runs(conversation_id="conv-killed-after-return")
    resumed = resume_agent.spawn("continue", recorder.endpoint, run.run_id)  # continue_run in a new process
    assert resumed["history"] == len(snapshot.messages)


async def test_killed_inside_a_tool_the_effect_reads_unresolved_within_2_s(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    journal = Path(os.environ["STEPREC_JOURNAL_DIR"])
    done = _kill_child(recorder.endpoint, journal, _KILLED_INSIDE_A_TOOL)
    assert done.returncode == -signal.SIGKILL, done.stderr

    async def unresolved():
        runs = await client.list_runs(conversation_id="conv-killed-in-tool")
        return runs and await client.list_unresolved_tool_effects(runs[0].run_id)

    effects = await eventually(unresolved)
    assert effects and [e.tool_call_id for e in effects] == ["pay-1"]
    (run,) = await client.list_runs(conversation_id="conv-killed-in-tool")
    events = await client.list_events(run.run_id)
    assert events[-1].kind == "tool_call_started"


async def test_killed_while_the_recorder_is_down_everything_arrives_once_when_it_starts(tmp_path: Path) -> None:
    from .test_delivery import _free_port

    endpoint = f"127.0.0.1:{_free_port()}"
    journal = Path(os.environ["STEPREC_JOURNAL_DIR"])
    done = _kill_child(endpoint, journal, _KILLED_INSIDE_A_TOOL)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert list(journal.glob("journal-*.log"))
    with RecorderProcess(tmp_path / "recorder", listen=endpoint):
        async with RecorderClient(endpoint) as client:

            async def unresolved():
                runs = await client.list_runs(conversation_id="conv-killed-in-tool")
                return runs and await client.list_unresolved_tool_effects(runs[0].run_id)

            assert await eventually(unresolved, seconds=5)
            (run,) = await client.list_runs(conversation_id="conv-killed-in-tool")
            events = await client.list_events(run.run_id)
            assert [e.kind for e in events] == ["run_started", "model_request_started", "model_request_completed",
                                                "tool_call_started"]  # fmt: skip
            assert len({e.idempotency_key for e in events}) == len(events)
    shutdown_pipelines()


def _steprec(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "steprec.query.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


async def test_journal_status_and_push_deliver_a_dead_agents_journal_by_hand(tmp_path: Path) -> None:
    from .test_delivery import _free_port

    endpoint, journal = f"127.0.0.1:{_free_port()}", tmp_path / "elsewhere"
    done = _kill_child(endpoint, journal, _KILLED_INSIDE_A_TOOL)
    assert done.returncode == -signal.SIGKILL, done.stderr
    status = _steprec("journal", "status", str(journal), "--json")
    assert status.returncode == 0, status.stderr
    (segment,) = json.loads(status.stdout)
    assert not segment["owner_alive"] and segment["unsent_frames"] >= 1
    assert _steprec("journal", "push", str(journal), "--endpoint", endpoint).returncode == 4  # nobody listens
    assert _steprec("journal", "status", str(tmp_path / "missing")).returncode == 2
    foreign = _segment(journal, _registration("run-pushed-before-foreign"), b"\xff\xfe not a protobuf message")
    with RecorderProcess(tmp_path / "recorder", listen=endpoint):  # it does not adopt `journal` by itself
        pushed = _steprec("journal", "push", str(journal), "--endpoint", endpoint)
        assert pushed.returncode == 0 and "pushed" in pushed.stdout, pushed.stderr
        assert f"{foreign.name}: the frame at byte" in pushed.stdout and "not an OTLP request" in pushed.stdout
        assert not list(journal.glob("journal-*.log")) and (journal / "rejected" / foreign.name).exists()
        async with RecorderClient(endpoint) as client:
            (run,) = await client.list_runs(conversation_id="conv-killed-in-tool")
            assert [e.tool_call_id for e in await client.list_unresolved_tool_effects(run.run_id)] == ["pay-1"]
            assert [r.run_id for r in await client.list_runs(conversation_id="conv-hostile")] == [
                "run-pushed-before-foreign"
            ]


def _segment(folder: Path, *payloads: bytes, tail: bytes = b"") -> Path:
    path = folder / f"journal-1-{uuid.uuid4().hex}.log"
    with open(path, "ab", buffering=0) as file:
        for sequence, payload in enumerate(payloads):
            append_frame(file, sequence, payload)
        file.write(tail)
    return path


def _registration(run_id: str) -> bytes:
    scope = _records.RunScope(run_id, "conv-hostile", None, "hostile")
    record = _records.step_event(scope, "run_started", step_index=0, idempotency_key="0:0:run_started:",
                                 registration_id=str(uuid.uuid4()))  # fmt: skip
    return RequestEnvelope({}, "steprec.exporter", "test").request([record.data])


async def test_hostile_journal_segments_are_set_aside_and_their_good_frames_stored(tmp_path: Path) -> None:
    """Journal segments are a stranger's input to the recorder: torn, corrupt or foreign bytes, a bad `.pos`,
    a planted link. The good frames are stored once, the rest set aside in rejected/, and the recorder serves on."""
    folder = tmp_path / "hostile"
    folder.mkdir(mode=0o700)
    rng = random.Random(18)
    good = _segment(folder, _registration("run-good-tail"), tail=b"\x05\x00\x00\x00garbage")
    _segment(folder, bytes(rng.getrandbits(8) for _ in range(4096)))  # noise: no intact frame at all
    not_otlp = _segment(folder, _registration("run-before-junk"), b"\xff\xfe not a protobuf message")
    replayed = _segment(folder, _registration("run-replayed"))
    (folder / f"journal-2-{uuid.uuid4().hex}.log").write_bytes(replayed.read_bytes())  # the same frame twice
    bad_pos = _segment(folder, _registration("run-bad-pos"))
    bad_pos.with_suffix(".pos").write_text("999999999999")
    outside = tmp_path / "outside.log"
    outside.write_bytes(b"secret")
    (folder / "journal-3-link.log").symlink_to(outside)
    with RecorderProcess(tmp_path / "recorder", extra_args=("--adopt-journals", str(folder))) as recorder:
        async with RecorderClient(recorder.endpoint) as client:

            async def stored():
                runs = await client.list_runs(conversation_id="conv-hostile")
                return len(runs) == 4 and runs

            runs = await eventually(stored, seconds=5)
            assert runs and {r.run_id for r in runs} == {"run-good-tail", "run-before-junk", "run-replayed",
                                                         "run-bad-pos"}  # fmt: skip
            events = await client.list_events("run-replayed")
            assert len(events) == 1  # adopted twice, stored once
            # Still serving: a live agent records as usual.
            result = await echo_agent(recorder.endpoint, calls=1).run("go", conversation_id="conv-after")
            assert result.output == "saw 1 returns"
        rejected = {p.name for p in (folder / "rejected").iterdir()}
        assert {good.name, not_otlp.name} <= rejected and len(rejected) == 3
        assert (folder / "journal-3-link.log").is_symlink() and outside.read_bytes() == b"secret"
    shutdown_pipelines()


async def test_an_agent_adopting_a_segment_with_a_foreign_frame_sends_the_good_ones_and_records_on(
    recorder: RecorderProcess, client: RecorderClient, tmp_path: Path
) -> None:
    """A frame that is not an OTLP request, in a segment the agent adopted, was sent with the rest, refused whole
    (INVALID_ARGUMENT) and retried forever: nothing behind it, the agent's own runs included, reached the recorder.
    Now the frames before it are sent, the segment set aside, and the agent records on."""
    folder = tmp_path / "journal"
    folder.mkdir(mode=0o700)
    not_otlp = _segment(folder, _registration("run-before-foreign"), b"\xff\xfe not a protobuf message",
                        _registration("run-after-foreign"))  # fmt: skip
    torn = _segment(folder, _registration("run-before-torn"), tail=b"\x05\x00\x00\x00garbage")
    agent = echo_agent(recorder.endpoint, calls=1, journal_dir=folder)
    result = await agent.run("go", conversation_id="conv-adopting-agent")
    assert result.output == "saw 1 returns"
    assert len(await client.list_runs(conversation_id="conv-adopting-agent")) == 1
    hostile = {r.run_id for r in await client.list_runs(conversation_id="conv-hostile")}
    assert {"run-before-foreign", "run-before-torn"} <= hostile and "run-after-foreign" not in hostile
    assert {p.name for p in (folder / "rejected").iterdir()} == {not_otlp.name, torn.name}
    shutdown_pipelines()
