"""StepRecorder keeps pydantic-ai-harness StepPersistence's semantics, across a process boundary."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.run import AgentRunResult
from steprec.exporter import SnapshotSaved, StepRecorder, annotate_tool_effect
from steprec.query import RecorderClient, continue_run
from steprec.recorder.daemon.process import RecorderProcess

from .agents import calls_tool_then_answers, echo_agent, tool_returns

pytestmark = pytest.mark.usefixtures("recorder")


def _json(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


# -- run id resolution ------------------------------------------------------------------------


async def test_explicit_run_id_is_single_use(recorder: RecorderProcess, client: RecorderClient) -> None:
    agent = echo_agent(recorder.endpoint, calls=1, run_id="explicit-1")
    await agent.run("first")
    with pytest.raises(ValueError, match="already registered"):
        await agent.run("second")
    # Another process (here: another capability instance) is refused the same way.
    with pytest.raises(ValueError, match="explicit-1"):
        await echo_agent(recorder.endpoint, calls=1, run_id="explicit-1").run("third")
    assert len(await client.list_runs(agent_name="echoer")) == 1


async def test_derived_run_id_matches_the_reference(recorder: RecorderProcess, client: RecorderClient) -> None:
    agent = echo_agent(recorder.endpoint, calls=0, agent_name="librarian")
    result = await agent.run("hi", conversation_id="conv-derived")
    (run,) = await client.list_runs(conversation_id="conv-derived")
    name = b"librarian"
    expected = "sp-" + base64.urlsafe_b64encode(f"{len(name)}:librarian{result.run_id}".encode()).decode().rstrip("=")
    assert run.run_id == expected and run.agent_name == "librarian"


async def test_too_long_derived_run_id_fails_before_any_write(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    agent = echo_agent(recorder.endpoint, calls=0, agent_name="x" * 150)
    with pytest.raises(ValueError, match="200"):
        await agent.run("hi", conversation_id="conv-long")
    assert await client.list_runs(conversation_id="conv-long") == []


async def test_without_name_or_id_the_context_run_id_is_used_and_agent_name_recorded(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    result = await echo_agent(recorder.endpoint, calls=0).run("hi", conversation_id="conv-plain")
    (run,) = await client.list_runs(conversation_id="conv-plain")
    assert run.run_id == result.run_id and run.agent_name == "echoer"
    assert {e.agent_name for e in await client.list_events(run.run_id)} == {"echoer"}


async def test_missing_context_run_id_is_a_runtime_error() -> None:
    ctx = RunContext(deps=None, model=FunctionModel(lambda m, i: ModelResponse(parts=[])), usage=None, run_id=None)
    with pytest.raises(RuntimeError, match="run_id"):
        await StepRecorder().for_run(ctx)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"run_id": "../escape"}, "run_id"),
        ({"run_id": "x" * 201}, "1-200"),
        ({"endpoint": "not an endpoint"}, "endpoint"),
        ({"endpoint": "localhost:99999"}, "port"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"max_snapshots_per_run": 0}, "max_snapshots_per_run"),
        ({"delivery": "sometimes"}, "delivery"),
    ],
)
def test_bad_options_are_refused_at_construction(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StepRecorder(**options)


def test_from_spec_refuses_unknown_options() -> None:
    recorder = StepRecorder.from_spec(agent_name="a", capture_frontier=True, max_snapshots_per_run=3)
    assert (recorder.agent_name, recorder.capture_frontier, recorder.max_snapshots_per_run) == ("a", True, 3)
    with pytest.raises(ValueError, match="unknown StepRecorder option.*backend"):
        StepRecorder.from_spec(backend="sqlite")
    agent = Agent.from_spec(
        {"model": "test", "capabilities": [{"StepRecorder": {"agent_name": "spec-agent"}}]},
        custom_capability_types=[StepRecorder],
    )
    assert any(isinstance(c, StepRecorder) for c in agent.root_capability.capabilities)


# -- lineage ----------------------------------------------------------------------------------


async def test_parent_is_inferred_across_tasks_and_explicit_parent_wins(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    delegate = echo_agent(recorder.endpoint, calls=1)
    pinned = echo_agent(recorder.endpoint, calls=0, parent_run_id="someone-else")
    orchestrator = Agent(
        calls_tool_then_answers(1, tool="fan_out"),
        name="orchestrator",
        capabilities=[StepRecorder(endpoint=recorder.endpoint)],
    )

    @orchestrator.tool_plain
    async def fan_out(text: str) -> str:
        # Delegates in separate asyncio tasks still see the orchestrator's run, as ContextVars do.
        results = await asyncio.gather(delegate.run("a"), delegate.run("b"), pinned.run("c"))
        return ", ".join(r.output for r in results)

    result = await orchestrator.run("go", conversation_id="conv-fan")
    children = await client.list_runs(parent_run_id=result.run_id)
    assert len(children) == 2 and all(c.agent_name == "echoer" for c in children)
    assert len(await client.list_runs(parent_run_id="someone-else")) == 1
    for child in children:
        assert {e.parent_run_id for e in await client.list_events(child.run_id)} == {result.run_id}


# -- events -----------------------------------------------------------------------------------


async def test_failed_tool_and_failed_model_request_events(recorder: RecorderProcess, client: RecorderClient) -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not tool_returns(messages) and not any("boom" in str(m) for m in messages[1:]):
            return ModelResponse(parts=[ToolCallPart("explode", {})])
        raise TimeoutError("model gave up")

    agent = Agent(FunctionModel(model), capabilities=[StepRecorder(endpoint=recorder.endpoint)])

    @agent.tool_plain
    def explode() -> str:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await agent.run("go", conversation_id="conv-errors")
    (run,) = await client.list_runs(conversation_id="conv-errors")
    events = await client.list_events(run.run_id)
    failed = [e for e in events if e.kind == "tool_call_failed"]
    assert len(failed) == 1 and "boom" in failed[0].error and failed[0].tool_name == "explode"
    assert events[-1].kind == "run_failed"
    (effect,) = await client.list_tool_effects(run.run_id)
    assert effect.status == "failed" and "boom" in effect.effect_summary

    agent2 = Agent(FunctionModel(lambda m, i: (_ for _ in ()).throw(TimeoutError("model gave up"))),
                   capabilities=[StepRecorder(endpoint=recorder.endpoint)])  # fmt: skip
    with pytest.raises(TimeoutError):
        await agent2.run("go", conversation_id="conv-model-error")
    (run2,) = await client.list_runs(conversation_id="conv-model-error")
    kinds = [e.kind for e in await client.list_events(run2.run_id)]
    assert kinds == ["run_started", "model_request_started", "model_request_failed", "run_failed"]


async def test_idempotency_keys_are_deterministic(recorder: RecorderProcess, client: RecorderClient) -> None:
    keys = []
    for conversation in ("conv-k1", "conv-k2"):
        await echo_agent(recorder.endpoint, calls=2).run("go", conversation_id=conversation)
        (run,) = await client.list_runs(conversation_id=conversation)
        keys.append([e.idempotency_key for e in await client.list_events(run.run_id)])
    assert keys[0] == keys[1]
    assert keys[0][0] == "0:0:run_started:" and len(set(keys[0])) == len(keys[0])


async def test_metadata_is_on_the_run_and_every_event(recorder: RecorderProcess, client: RecorderClient) -> None:
    await echo_agent(recorder.endpoint, calls=1, metadata={"team": "blue"}).run("go", conversation_id="conv-meta")
    (run,) = await client.list_runs(conversation_id="conv-meta")
    assert run.metadata == {"team": "blue"}
    assert all(e.metadata == {"team": "blue"} for e in await client.list_events(run.run_id))


# -- snapshots --------------------------------------------------------------------------------


async def test_one_snapshot_per_settled_tool_cycle_and_no_redundant_final_one(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    result = await echo_agent(recorder.endpoint, calls=3).run("go", conversation_id="conv-snaps")
    (run,) = await client.list_runs(conversation_id="conv-snaps")
    snapshot = await client.latest_snapshot(run.run_id)
    # Three tool cycles and the final CallToolsNode -> snapshots 0..3; the last one already equals the
    # final history, so after_run adds none.
    assert snapshot.snapshot_index == 3 and _json(snapshot.messages) == _json(result.all_messages())


async def test_a_run_without_tools_gets_its_after_run_snapshot(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    result = await echo_agent(recorder.endpoint, calls=0).run("hi", conversation_id="conv-notools")
    (run,) = await client.list_runs(conversation_id="conv-notools")
    snapshot = await client.latest_snapshot(run.run_id)
    assert snapshot.snapshot_index == 0 and _json(snapshot.messages) == _json(result.all_messages())


@dataclass
class _RewriteFinalAnswer(AbstractCapability[Any]):
    """Rewrites the final text in place, same history length: the case a length check would miss."""

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        final = result.all_messages()[-1]
        final.parts[0] = TextPart("rewritten")
        return result


async def test_same_length_rewrite_after_the_last_boundary_is_saved(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    agent = Agent(
        FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("original")])),
        capabilities=[StepRecorder(endpoint=recorder.endpoint), _RewriteFinalAnswer()],
    )
    await agent.run("hi", conversation_id="conv-rewrite")
    (run,) = await client.list_runs(conversation_id="conv-rewrite")
    snapshot = await client.latest_snapshot(run.run_id)
    assert snapshot.messages[-1].parts[0].content == "rewritten"


class _HardStop(BaseException):
    """Not an Exception: tools cannot turn it into a retry, so the run dies mid-cycle."""


async def test_failure_mid_tool_cycle_leaves_an_interrupted_snapshot(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not tool_returns(messages):
            return ModelResponse(parts=[ToolCallPart("echo", {"text": "a"}, tool_call_id="ok-call")])
        return ModelResponse(parts=[ToolCallPart("crash", {}, tool_call_id="bad-call")])

    agent = Agent(FunctionModel(model), capabilities=[StepRecorder(endpoint=recorder.endpoint)])

    @agent.tool_plain
    def echo(text: str) -> str:
        return text

    @agent.tool_plain
    def crash() -> str:
        raise _HardStop  # escapes pydantic-ai's tool error handling, like a hard stop

    with pytest.raises(_HardStop):
        await agent.run("go", conversation_id="conv-interrupted")
    (run,) = await client.list_runs(conversation_id="conv-interrupted")
    complete = await client.latest_snapshot(run.run_id)
    interrupted = await client.latest_snapshot(run.run_id, include_interrupted=True)
    assert complete.state == "complete" and interrupted.state == "interrupted"
    last_response = [m for m in interrupted.messages if isinstance(m, ModelResponse)][-1]
    assert last_response.parts[0].tool_call_id == "bad-call"  # the proposed call is in the rescue point
    (unresolved,) = await client.list_unresolved_tool_effects(run.run_id)
    assert unresolved.tool_call_id == "bad-call"
    assert len(await continue_run(client, run_id=run.run_id)) < len(interrupted.messages)


async def test_capture_frontier_checkpoints_before_requests_and_tools(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise ConnectionError("first request fails")

    agent = Agent(FunctionModel(model), capabilities=[StepRecorder(endpoint=recorder.endpoint, capture_frontier=True)])
    with pytest.raises(ConnectionError):
        await agent.run("keep my prompt", conversation_id="conv-frontier")
    (run,) = await client.list_runs(conversation_id="conv-frontier")
    snapshot = await client.latest_snapshot(run.run_id, include_interrupted=True)
    assert snapshot is not None
    assert isinstance(snapshot.messages[0], ModelRequest)
    assert any(isinstance(p, UserPromptPart) and p.content == "keep my prompt" for p in snapshot.messages[0].parts)


@pytest.mark.parametrize(("mode", "delivery"), [("journal", "journaled"), ("acknowledged", "acknowledged")])
async def test_snapshot_saved_event_reports_how_each_snapshot_was_made_durable(
    recorder: RecorderProcess, mode: str, delivery: str
) -> None:
    from pydantic_ai.capabilities import Hooks

    seen: list[SnapshotSaved] = []
    hooks = Hooks()

    @hooks.on.event(SnapshotSaved)
    async def remember(ctx: RunContext[Any], event: SnapshotSaved) -> None:
        seen.append(event)

    # Event observers make pydantic-ai stream, which TestModel supports.
    agent = Agent(TestModel(), capabilities=[StepRecorder(endpoint=recorder.endpoint, delivery=mode), hooks])

    @agent.tool_plain
    def echo(text: str) -> str:
        return text

    result = await agent.run("go")
    # The tool cycle's snapshot is announced while the run streams (the closing after_run
    # fallback comes after the event stream has ended, so observers do not see that one).
    assert [e.snapshot_index for e in seen] == [0]
    (event,) = seen
    assert (event.run_id, event.state, event.delivery) == (result.run_id, "complete", delivery)


# -- tool-effect ledger -----------------------------------------------------------------------


async def test_annotations_merge_and_survive_the_terminal_record(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    agent = Agent(calls_tool_then_answers(1, tool="label"), capabilities=[StepRecorder(endpoint=recorder.endpoint)])

    @agent.tool
    async def label(ctx: RunContext[None], text: str) -> str:
        await annotate_tool_effect(ctx, idempotency_key="label-7")
        await annotate_tool_effect(ctx, effect_summary="added label 'bug'")
        return "done"

    await agent.run("go", conversation_id="conv-annotate")
    (run,) = await client.list_runs(conversation_id="conv-annotate")
    (effect,) = await client.list_tool_effects(run.run_id)
    assert (effect.status, effect.idempotency_key, effect.effect_summary) == (
        "completed",
        "label-7",
        "added label 'bug'",
    )
    assert effect.ended_at >= effect.started_at


async def test_annotate_outside_a_recorded_tool_call_is_a_no_op() -> None:
    ctx = RunContext(deps=None, model=FunctionModel(lambda m, i: ModelResponse(parts=[])), usage=None)
    await annotate_tool_effect(ctx, idempotency_key="nothing")  # no recorded run active: nothing happens


# -- correlation ------------------------------------------------------------------------------


async def test_records_carry_the_active_trace_and_span(recorder: RecorderProcess, client: RecorderClient) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from pydantic_ai.models.instrumented import InstrumentationSettings

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    agent = echo_agent(recorder.endpoint, calls=1)
    agent.instrument = InstrumentationSettings(tracer_provider=provider)
    await agent.run("go", conversation_id="conv-trace")
    (run,) = await client.list_runs(conversation_id="conv-trace")
    events = await client.list_events(run.run_id)
    trace_ids = {f"{s.context.trace_id:032x}" for s in spans.get_finished_spans()}
    span_ids = {f"{s.context.span_id:016x}" for s in spans.get_finished_spans()}
    assert len(trace_ids) == 1 and {e.trace_id for e in events} == trace_ids
    tool_started = next(e for e in events if e.kind == "tool_call_started")
    assert tool_started.span_id in span_ids


# -- durable execution ------------------------------------------------------------------------


def test_every_write_is_a_durable_operation_with_serialisable_arguments() -> None:
    # pydantic-ai's own collector (private module: the public API only runs it under an engine).
    from pydantic_ai.durable_exec._capability_operation import collect_capability_operations

    operations = collect_capability_operations(StepRecorder())
    assert set(operations) == {"registration_id", "append_event", "save_snapshot", "record_tool_effect"}
    arguments = {
        "snapshot_index": 3, "step_index": 4, "state": "complete", "base_index": 2, "keep": 7,
        "append_refs": b"\x00" * 32, "new_messages": ['{"kind":"request","parts":[]}'],
    }  # fmt: skip
    validated = operations["save_snapshot"].schema.validator.validate_python(arguments)
    assert validated == arguments
    for name in ("registration_id", "append_event", "record_tool_effect"):
        assert operations[name].ctx_parameter is None  # plain values only: nothing live crosses the boundary


async def test_max_snapshots_per_run_is_applied_by_the_recorder(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    import duckdb

    result = await echo_agent(recorder.endpoint, calls=5, max_snapshots_per_run=2).run(
        "go", conversation_id="conv-keep"
    )
    latest = await client.latest_snapshot(result.run_id)
    assert _json(latest.messages) == _json(result.all_messages())
    recorder.stop()
    with duckdb.connect(str(recorder.data_dir / "steprec.duckdb"), read_only=True) as db:
        kept = db.execute("SELECT count(*) FROM snapshots WHERE run_id = ? AND NOT pruned", [result.run_id]).fetchone()
        assert kept[0] == 2
