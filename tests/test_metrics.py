"""Prometheus metrics: counts that add up, and the token guarding them when one is set."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
from steprec.exporter import shutdown_pipelines
from steprec.recorder.daemon.process import RecorderProcess

from .agents import echo_agent


def _scrape(url: str, token: str | None = None) -> dict[str, float]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


async def test_metrics_count_what_was_received_and_applied(tmp_path: Path) -> None:
    recorder = RecorderProcess(tmp_path / "r", extra_args=("--metrics-listen", "127.0.0.1:0")).start()
    try:
        await echo_agent(recorder.endpoint, calls=3, journal_dir=tmp_path / "journal").run("go")
        shutdown_pipelines()
        metrics = _scrape(recorder.metrics_url)
        received = metrics["steprec_records_received_total"]
        assert received >= 3 * 4 + 4  # at least the events, effects and snapshots of three tool calls
        assert metrics["steprec_records_accepted_total"] == received
        assert metrics["steprec_database_bytes"] > 0
        assert metrics["steprec_export_requests_total"] >= 1
        # What each part of the memory budget holds: the run's messages, its state, DuckDB's pages.
        assert metrics["steprec_message_cache_entries"] >= 3
        assert metrics["steprec_message_cache_bytes"] > 3 * 100
        assert metrics["steprec_run_states"] >= 1 and metrics["steprec_run_state_bytes"] > 1000
        assert metrics["steprec_duckdb_memory_bytes"] > 0 and metrics["steprec_filter_bytes"] > 0
        assert metrics["steprec_assembly_bytes"] == 0
    finally:
        recorder.stop()


def test_metrics_need_the_token_when_one_is_set(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret")
    recorder = RecorderProcess(
        tmp_path / "r", extra_args=("--metrics-listen", "127.0.0.1:0", "--token-file", str(tmp_path / "token"))
    ).start()
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            _scrape(recorder.metrics_url)
        assert refused.value.code == 401
        assert "steprec_wal_pending_entries" in _scrape(recorder.metrics_url, token="s3cret")
    finally:
        recorder.stop()


async def test_reflection_lists_the_services_and_logs_can_be_json(tmp_path: Path) -> None:
    import json

    import grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    recorder = RecorderProcess(tmp_path / "r", extra_args=("--log-format", "json")).start()
    try:
        async with grpc.aio.insecure_channel(recorder.endpoint) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(list_services="")

            async def one_request():
                yield request

            async for response in stub.ServerReflectionInfo(one_request()):
                names = {s.name for s in response.list_services_response.service}
        assert {"steprec.query.v1.RecorderQuery", "opentelemetry.proto.collector.logs.v1.LogsService"} <= names
    finally:
        recorder.stop()
    lines = [line for line in recorder.log_path.read_text().splitlines() if line.startswith("{")]
    assert lines and all(json.loads(line)["level"] in {"info", "warning", "error"} for line in lines)
