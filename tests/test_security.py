"""A recorder with a token: calls without it are refused, with it they work, and the token is never printed."""

from __future__ import annotations

import secrets
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc

from steprec.exporter import shutdown_pipelines
from steprec.query import RecorderClient
from steprec.recorder.process import RecorderProcess

from .agents import echo_agent


@pytest.fixture
def guarded(tmp_path: Path):
    token = secrets.token_urlsafe(24)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    process = RecorderProcess(tmp_path / "recorder", extra_args=("--token-file", str(token_file))).start()
    try:
        yield process, token
    finally:
        shutdown_pipelines()
        process.stop()


async def test_calls_without_the_token_are_unauthenticated(guarded) -> None:
    recorder, token = guarded
    async with grpc.aio.insecure_channel(recorder.endpoint) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await logs_service_pb2_grpc.LogsServiceStub(channel).Export(logs_service_pb2.ExportLogsServiceRequest())
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as wrong:
            await logs_service_pb2_grpc.LogsServiceStub(channel).Export(
                logs_service_pb2.ExportLogsServiceRequest(), metadata=(("authorization", "Bearer nope"),)
            )
        assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED and token not in wrong.value.details()
        # Health stays open for container probes.
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    async with RecorderClient(recorder.endpoint) as anonymous:
        with pytest.raises(PermissionError, match="refused"):
            await anonymous.list_runs()


async def test_with_the_token_everything_works_and_it_is_never_logged(guarded, tmp_path: Path) -> None:
    recorder, token = guarded
    agent = echo_agent(recorder.endpoint, calls=2, token=token, spool_dir=tmp_path / "spool")
    result = await agent.run("go", conversation_id="conv-token")
    async with RecorderClient(recorder.endpoint, token=token) as client:
        (run,) = await client.list_runs(conversation_id="conv-token")
        assert run.run_id == result.run_id and run.outcome == "completed"
    assert token not in repr(agent.root_capability)
    shutdown_pipelines()
    recorder.stop()
    assert token not in recorder.log_path.read_text()


async def test_an_agent_without_the_token_is_not_stored_and_not_held_up(guarded, tmp_path: Path) -> None:
    recorder, token = guarded
    result = await echo_agent(recorder.endpoint, calls=1, spool_dir=tmp_path / "spool").run("go", conversation_id="c")
    assert result.output == "saw 1 returns"  # refused delivery spools; the agent is not failed
    async with RecorderClient(recorder.endpoint, token=token) as client:
        assert await client.list_runs(conversation_id="c") == []
