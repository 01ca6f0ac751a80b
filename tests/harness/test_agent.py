"""A real pydantic-ai agent with the harness's own StepPersistence, keeping its steps in a recorder."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai_harness.step_persistence import (
    ContinuableSnapshot,
    InMemoryStepStore,
    StepPersistence,
    StepStore,
    annotate_tool_effect,
    continue_run,
    fork_run,
)
from steprec.query import RecorderClient, RecorderStepStore
from steprec.query import continue_run as recorder_continue_run
from steprec.recorder.daemon.process import RecorderProcess

from ..agents import calls_tool_then_answers, tool_returns


def echo_agent(store: StepStore, calls: int = 3, **options: Any) -> Agent:
    """The echo agent of tests/agents.py, persisted by StepPersistence; its tool annotates its effect."""
    agent = Agent(calls_tool_then_answers(calls), name="echoer", capabilities=[StepPersistence(store=store, **options)])

    @agent.tool
    async def echo(ctx: RunContext[None], text: str) -> str:
        await annotate_tool_effect(store, ctx, idempotency_key=f"echo:{text}", effect_summary="printed once")
        return f"echo: {text}"

    return agent


class SpyStore(RecorderStepStore):
    """Keeps what StepPersistence handed over, to compare with what reads back."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.saved: list[ContinuableSnapshot] = []

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        self.saved.append(snapshot)
        await super().save_snapshot(snapshot)


@pytest.fixture
async def spy_store(recorder: RecorderProcess) -> AsyncIterator[SpyStore]:
    async with SpyStore(recorder.endpoint) as store:
        yield store


def _shape(events) -> list[tuple]:
    """What two runs of one agent share: everything but run ids and times."""
    return [
        (e.kind, e.step_index, e.tool_call_id, e.tool_name, e.error, e.metadata, e.idempotency_key, e.agent_name)
        for e in events
    ]


async def _effects(store: StepStore, run_id: str, call_ids: list[str]) -> list[tuple]:
    effects = [await store.get_tool_effect(run_id=run_id, tool_call_id=call_id) for call_id in call_ids]
    return [(e.status, e.tool_name, e.idempotency_key, e.effect_summary, e.ended_at is not None) for e in effects]


async def test_agent_run_reads_back_through_harness_helpers_and_recorder_client(
    spy_store: SpyStore, client: RecorderClient
) -> None:
    store = spy_store
    assert isinstance(store, StepStore)
    agent = echo_agent(store, metadata={"team": "blue"})
    result = await agent.run("go", conversation_id="conv-harness")
    memory = InMemoryStepStore()
    reference = await echo_agent(memory, metadata={"team": "blue"}).run("go", conversation_id="conv-harness")

    run_id = result.run_id
    run = await store.get_run(run_id=run_id)
    assert run is not None and run.registration_id
    assert (run.agent_name, run.conversation_id, run.metadata) == ("echoer", "conv-harness", {"team": "blue"})

    # The same steps, keys, snapshots and ledger as the harness's own store records for the same run.
    events = await store.list_events(run_id=run_id)
    assert _shape(events) == _shape(await memory.list_events(run_id=reference.run_id))
    snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
    expected = await memory.list_snapshots(run_id=reference.run_id, include_interrupted=True)
    assert [(s.idempotency_key, s.state, s.step_index, len(s.messages)) for s in snapshots] == [
        (s.idempotency_key, s.state, s.step_index, len(s.messages)) for s in expected
    ]
    assert snapshots == store.saved  # every field, every message, every timestamp
    call_ids = [e.tool_call_id for e in events if e.kind == "tool_call_started"]
    assert len(call_ids) == 3
    assert await _effects(store, run_id, call_ids) == await _effects(memory, reference.run_id, call_ids)
    assert (await store.get_tool_effect(run_id=run_id, tool_call_id=call_ids[0])).idempotency_key == "echo:call 0"
    assert await store.list_unresolved_tool_effects(run_id=run_id) == []

    # The harness's helpers read from it.
    history = await continue_run(store, run_id=run_id)
    assert history == result.all_messages()
    assert await fork_run(store, run_id=run_id) == history
    follow_up = await agent.run("again", message_history=history, conversation_id="conv-harness")
    assert follow_up.all_messages()[: len(history)] == history
    assert [r.run_id for r in await store.list_runs(conversation_id="conv-harness")] == [run_id, follow_up.run_id]

    # And RecorderClient reads the very same records.
    client_events = await client.list_events(run_id)
    assert [(e.kind, e.idempotency_key, e.timestamp) for e in client_events] == [
        (e.kind, e.idempotency_key, e.timestamp) for e in events
    ]
    assert [(s.snapshot_index, s.idempotency_key) for s in await client.list_snapshots(run_id)] == [
        (int(s.idempotency_key.split(":")[0]), s.idempotency_key) for s in snapshots if s.state == "complete"
    ]
    assert await recorder_continue_run(client, run_id=run_id) == history
    ledger = await client.list_tool_effects(run_id)
    assert [(e.tool_call_id, e.status, e.started_at, e.ended_at) for e in ledger] == [
        (e.tool_call_id, e.status, e.started_at, e.ended_at)
        for e in [await store.get_tool_effect(run_id=run_id, tool_call_id=c) for c in call_ids]
    ]
    assert (await client.get_run(run_id)).outcome == "completed"


async def test_explicit_run_id_is_single_use(recorder: RecorderProcess, store: RecorderStepStore) -> None:
    agent = echo_agent(store, calls=1, run_id="explicit-1")
    await agent.run("first")
    with pytest.raises(ValueError, match="already in the store"):
        await agent.run("second")
    # A second process (here: another store and capability) is refused the same way.
    async with RecorderStepStore(recorder.endpoint) as other:
        with pytest.raises(ValueError, match="explicit-1"):
            await echo_agent(other, calls=1, run_id="explicit-1").run("third")
    assert [r.run_id for r in await store.list_runs()] == ["explicit-1"]
    kinds = [e.kind for e in await store.list_events(run_id="explicit-1")]
    assert kinds.count("run_started") == 1 and kinds[-1] == "run_completed"


async def test_failed_tool_and_model_leave_what_the_harness_store_leaves(store: RecorderStepStore) -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not tool_returns(messages) and not any("boom" in str(m) for m in messages[1:]):
            return ModelResponse(parts=[ToolCallPart("explode", {}, tool_call_id="call-x")])
        raise TimeoutError("model gave up")

    async def failing_run(target: StepStore) -> str:
        agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=target)])

        @agent.tool_plain
        def explode() -> str:
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            await agent.run("go")
        (run,) = await target.list_runs()
        return run.run_id

    memory = InMemoryStepStore()
    run_id, reference_id = await failing_run(store), await failing_run(memory)
    assert _shape(await store.list_events(run_id=run_id)) == _shape(await memory.list_events(run_id=reference_id))
    for include_interrupted in (False, True):
        got = await store.latest_snapshot(run_id=run_id, include_interrupted=include_interrupted)
        want = await memory.latest_snapshot(run_id=reference_id, include_interrupted=include_interrupted)
        assert (got is None) == (want is None)
        if got is not None:
            assert (got.state, got.idempotency_key, len(got.messages)) == (
                want.state,
                want.idempotency_key,
                len(want.messages),
            )
    assert await _effects(store, run_id, ["call-x"]) == await _effects(memory, reference_id, ["call-x"])


async def test_a_tool_that_never_returns_stays_unresolved(store: RecorderStepStore) -> None:
    """A tool killed mid-flight (here: a BaseException, which no hook records) leaves a `started` effect."""

    class Killed(BaseException):
        pass

    async def killed_run(target: StepStore) -> str:
        agent = Agent(TestModel(), capabilities=[StepPersistence(store=target)])

        @agent.tool_plain
        def charge_card(amount: int) -> str:
            raise Killed

        with pytest.raises(Killed):
            await agent.run("pay")
        (run,) = await target.list_runs()
        return run.run_id

    memory = InMemoryStepStore()
    run_id, reference_id = await killed_run(store), await killed_run(memory)
    unresolved = await store.list_unresolved_tool_effects(run_id=run_id)
    expected = await memory.list_unresolved_tool_effects(run_id=reference_id)
    assert [(e.tool_name, e.status, e.ended_at) for e in unresolved] == [
        (e.tool_name, e.status, e.ended_at) for e in expected
    ]
    assert [e.tool_name for e in unresolved] == ["charge_card"]
    assert _shape(await store.list_events(run_id=run_id)) == _shape(await memory.list_events(run_id=reference_id))
