"""A full disk under a running recorder: writes are refused with a clear status, reads go on, and
everything comes back by itself when space returns, with nothing acknowledged lost or stored twice.

The data folder is a small tmpfs, filled with a ballast file: a real ENOSPC from the kernel at
every write the recorder makes (its log, DuckDB, media), not a simulated one.
"""

from __future__ import annotations

import errno
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from steprec.exporter import shutdown_pipelines
from steprec.proto import wire
from steprec.query import RecorderClient
from steprec.recorder.process import RecorderProcess

from .agents import echo_agent


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"a full disk needs a small tmpfs, and mounting one was not permitted: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def _fill(folder: Path) -> Path:
    """Write a ballast file until the kernel says the disk is full."""
    ballast = folder / "ballast"
    with open(ballast, "wb") as file:
        try:
            while True:
                file.write(b"\0" * (1 << 20))
                file.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC
    return ballast


def _request(run_id: str, count: int) -> logs_service_pb2.ExportLogsServiceRequest:
    def attribute(key: str, value: str | int) -> KeyValue:
        any_value = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
        return KeyValue(key=key, value=any_value)

    records = [
        LogRecord(
            time_unix_nano=time.time_ns(),
            event_name=wire.EVENT_PREFIX + "model_request_started",
            attributes=[
                attribute(wire.RUN_ID, run_id),
                attribute(wire.STEP_INDEX, i),
                attribute(wire.IDEMPOTENCY_KEY, f"{run_id}:{i}"),
                attribute("pad", "x" * 2000),
            ],
        )  # fmt: skip
        for i in range(count)
    ]
    return logs_service_pb2.ExportLogsServiceRequest(
        resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=records)])]
    )


def _send_until_taken(export, request: logs_service_pb2.ExportLogsServiceRequest, patience: float = 30) -> None:
    deadline = time.monotonic() + patience
    while True:
        try:
            export(request, timeout=10)
            return
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


async def test_a_full_disk_refuses_writes_serves_reads_and_recovers(small_disk: Path) -> None:
    recorder = RecorderProcess(small_disk / "recorder").start()
    channel = grpc.insecure_channel(recorder.endpoint)
    export = logs_service_pb2_grpc.LogsServiceStub(channel).Export
    try:
        export(_request("before", 20), timeout=10)
        async with RecorderClient(recorder.endpoint) as client:
            assert len(await client.list_events("before")) == 20  # applied to DuckDB
        export(_request("in-the-log", 20), timeout=10)  # acknowledged; maybe not applied before the disk fills
        ballast = _fill(small_disk)

        # Writes: refused, each with a status that says why and that a retry is welcome.
        refused = []
        for n in range(20):
            try:
                export(_request(f"during-{n}", 50), timeout=10)
            except grpc.RpcError as error:
                refused.append(n)
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
                assert "No space left on device" in error.details() and "retry" in error.details()
        assert len(refused) >= 15, "once the disk is full, writes must be refused"

        async with RecorderClient(recorder.endpoint) as client:
            # Reads go on, answering with everything applied, while the disk stays full.
            assert len(await client.list_events("before")) == 20
            table = await client.sql("SELECT count(*) AS n FROM events WHERE run_id = 'before'")
            assert table.column("n").to_pylist() == [20]
            # An agent run meanwhile finishes on time: its records wait in its own spool.
            started = time.monotonic()
            result = await echo_agent(recorder.endpoint, calls=3).run("go", conversation_id="conv-full")
            assert result.output == "saw 3 returns" and time.monotonic() - started < 30

            ballast.unlink()
            # Space is back: the refused requests are taken when sent again (as exporters do, retrying
            # while the applier's backoff ends), and the spool drains.
            for n in refused:
                _send_until_taken(export, _request(f"during-{n}", 50))
            shutdown_pipelines()
            for n in refused:
                keys = [e.idempotency_key for e in await client.list_events(f"during-{n}")]
                assert keys == [f"during-{n}:{i}" for i in range(50)]
            (run,) = await client.list_runs(conversation_id="conv-full")
            kinds = [e.kind for e in await client.list_events(run.run_id)]
            assert (
                kinds[0] == "run_started" and kinds[-1] == "run_completed" and kinds.count("tool_call_completed") == 3
            )
            assert len(await client.list_events("before")) == 20
            assert len(await client.list_events("in-the-log")) == 20
        assert recorder.process is not None and recorder.process.poll() is None
    finally:
        channel.close()
        shutdown_pipelines()
        recorder.kill()
