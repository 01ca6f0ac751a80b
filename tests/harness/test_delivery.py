"""How RecorderStepStore's writes travel: acknowledged off the loop, journaled while the recorder is down."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)
from pydantic_ai_harness.step_persistence import ContinuableSnapshot, RunRecord, ToolEffectRecord
from steprec.exporter import shutdown_pipelines
from steprec.query import RecorderStepStore, RecorderUnavailable

from .conftest import StorePair


async def test_writes_wait_for_the_recorder_without_blocking_the_loop(store: RecorderStepStore) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(ticker())
    try:
        await asyncio.gather(
            *(
                store.record_tool_effect(
                    ToolEffectRecord(tool_call_id=f"call-{n}", tool_name="echo", run_id="run-c", status="started")
                )
                for n in range(50)
            )
        )
    finally:
        ticking.cancel()
    assert ticks > 50
    assert len(await store.list_unresolved_tool_effects(run_id="run-c")) == 50


async def test_large_messages_and_media_round_trip(store_pair: Callable[..., StorePair]) -> None:
    at = datetime(2026, 3, 1, tzinfo=UTC)
    image = BinaryContent(bytes(range(256)) * 1200, media_type="image/png")  # the recorder keeps it as a blob
    big = ModelResponse(parts=[TextPart("x" * (3 << 19))], timestamp=at)  # 1.5 MiB of JSON: sent as fragments
    history = [ModelRequest(parts=[UserPromptPart(["look", image], timestamp=at)], timestamp=at), big]
    stores = store_pair()
    for store in stores:
        await store.register_run(RunRecord(run_id="run-big", started_at=at, registration_id="reg"))
        for index in range(2):
            await store.save_snapshot(
                ContinuableSnapshot(run_id="run-big", step_index=index, messages=history[: index + 1], timestamp=at,
                                    idempotency_key=f"{index}:{index}:complete")
            )  # fmt: skip
    got, want = [await s.list_snapshots(run_id="run-big") for s in stores]
    # Equal as JSON: like the harness's SQLite and file stores, and unlike its in-memory one, the
    # store hands back the messages' JSON round trip (which fills in BinaryContent's identifier).
    assert [ModelMessagesTypeAdapter.dump_json(s.messages) for s in got] == [
        ModelMessagesTypeAdapter.dump_json(s.messages) for s in want
    ]
    assert [(s.idempotency_key, s.timestamp) for s in got] == [(s.idempotency_key, s.timestamp) for s in want]


async def test_with_the_recorder_down_writes_are_journaled_and_reads_fail() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{probe.getsockname()[1]}"
    try:
        async with RecorderStepStore(endpoint, timeout_seconds=1) as store:
            await store.register_run(RunRecord(run_id="run-down", registration_id="reg"))
            with pytest.raises(RecorderUnavailable):
                await store.get_run(run_id="run-down")
    finally:
        shutdown_pipelines()


def test_a_store_made_before_any_loop_serves_several_asyncio_runs(recorder) -> None:
    """The reference's examples make their store at module level, then `asyncio.run(main())` (issue 20)."""
    store = RecorderStepStore(recorder.endpoint)

    async def register(run_id: str) -> list[str]:
        await store.register_run(RunRecord(run_id=run_id, registration_id=f"reg-{run_id}"))
        return [run.run_id for run in await store.list_runs()]

    assert asyncio.run(register("run-loop-1")) == ["run-loop-1"]
    assert sorted(asyncio.run(register("run-loop-2"))) == ["run-loop-1", "run-loop-2"]

    async def read_and_close() -> RunRecord | None:
        try:
            return await store.get_run(run_id="run-loop-1")
        finally:
            await store.close()

    assert asyncio.run(read_and_close()).registration_id == "reg-run-loop-1"
    shutdown_pipelines()
