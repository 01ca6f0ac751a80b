"""A full disk under a running recorder (issue 6): writes refused with a clear status, reads served,
recovery by itself when space returns, nothing acknowledged lost or stored twice.

The recorder's data folder is a small tmpfs filled with a ballast file: every write it makes (its
log, DuckDB, media) meets a real ENOSPC from the kernel. Mounting needs root (or CAP_SYS_ADMIN);
`small_disk` says so when it is not allowed rather than pretending.
"""

from __future__ import annotations

import asyncio
import errno
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from steprec.exporter import shutdown_pipelines
from steprec.query import RecorderClient
from steprec.recorder.daemon.process import RecorderProcess

from benchmarks.load import step_events_request
from tests.agents import echo_agent

REQUEST_RECORDS = 50
"""Step events per request sent while the disk is full; each carries 2 KB so the disk matters."""


class MountRefused(Exception):
    """This process may not mount a tmpfs, so a real full disk cannot be made here."""


@contextmanager
def small_disk(size: str = "64m") -> Iterator[Path]:
    """A fresh tmpfs of `size`, unmounted (lazily, so a straggler cannot block it) afterwards."""
    with tempfile.TemporaryDirectory(prefix="steprec-disk-") as scratch:
        folder = Path(scratch)
        command = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)]
        mounted = subprocess.run(command, capture_output=True, text=True)
        if mounted.returncode != 0:
            raise MountRefused(f"mounting a tmpfs was not permitted: {mounted.stderr.strip()}")
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
            if error.errno != errno.ENOSPC:
                raise
    return ballast


def _request(run_id: str, count: int) -> logs_service_pb2.ExportLogsServiceRequest:
    return step_events_request(run_id, 0, count, padding=2000)


def _send_until_taken(export, request: logs_service_pb2.ExportLogsServiceRequest, patience: float = 30) -> None:
    """Send as an exporter does: UNAVAILABLE is retried (the applier may still be backing off)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            export(request, timeout=10)
            return
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass
class DiskFullResult:
    requests_while_full: int
    refused: int
    refusal_details: set[str]
    """Every distinct status text a refused request got."""
    reads_while_full: int
    """Reads answered while the disk was full (each checked against what was applied before)."""
    agent_seconds_while_full: float
    """Wall time of a 3-step recorded agent run while the disk was full."""
    agent_trail_complete: bool
    """The agent's run reads from `run_started` to `run_completed` with its three tool calls, once each."""
    recovery_seconds: float
    """From the ballast removed to every refused request taken again and the agent's journal drained."""
    records_expected: int
    """Step events sent by the test itself: before, while and after the disk was full."""
    records_stored: int
    duplicates: int
    recorder_alive: bool


async def disk_full(folder: Path, *, requests: int = 20) -> DiskFullResult:
    """Fill `folder` (a small disk) under a recorder, try to write and read, free it, and count."""
    recorder = RecorderProcess(folder / "recorder").start()
    channel = grpc.insecure_channel(recorder.endpoint)
    export = logs_service_pb2_grpc.LogsServiceStub(channel).Export
    try:
        async with RecorderClient(recorder.endpoint) as client:
            export(_request("before", 20), timeout=10)
            applied_before = len(await client.list_events("before"))  # now in DuckDB, not only in the log
            export(_request("in-the-log", 20), timeout=10)  # acknowledged; maybe not applied before the disk fills
            ballast = _fill(folder)

            refused, details = [], set()
            for n in range(requests):
                try:
                    export(_request(f"during-{n}", REQUEST_RECORDS), timeout=10)
                except grpc.RpcError as error:
                    refused.append(n)
                    details.add(f"{error.code().name}: {error.details()}")
            reads = 0
            if len(await client.list_events("before")) == applied_before:
                reads += 1
            table = await client.sql("SELECT count(*) AS n FROM events WHERE run_id = 'before'")
            reads += table.column("n").to_pylist() == [applied_before]
            started = time.monotonic()
            await echo_agent(recorder.endpoint, calls=3).run("go", conversation_id="conv-full")
            agent_seconds = time.monotonic() - started

            ballast.unlink()
            freed = time.monotonic()
            for n in refused:
                _send_until_taken(export, _request(f"during-{n}", REQUEST_RECORDS))
            shutdown_pipelines()  # the agent's journal drains
            recovery = time.monotonic() - freed

            keys = await client.sql(
                "SELECT run_id || '/' || idempotency_key AS k FROM events"
                " WHERE run_id IN ('before', 'in-the-log') OR run_id LIKE 'during-%'"
            )
            stored = keys.column("k").to_pylist()
            (run,) = await client.list_runs(conversation_id="conv-full")
            events = await client.list_events(run.run_id)
            kinds = [e.kind for e in events]
        return DiskFullResult(
            requests_while_full=requests,
            refused=len(refused),
            refusal_details=details,
            reads_while_full=reads,
            agent_seconds_while_full=agent_seconds,
            agent_trail_complete=(
                kinds[0] == "run_started"
                and kinds[-1] == "run_completed"
                and kinds.count("tool_call_completed") == 3
                and len({e.idempotency_key for e in events}) == len(events)
            ),  # fmt: skip
            recovery_seconds=recovery,
            records_expected=40 + requests * REQUEST_RECORDS,
            records_stored=len(set(stored)),
            duplicates=len(stored) - len(set(stored)),
            recorder_alive=recorder.process is not None and recorder.process.poll() is None,
        )
    finally:
        channel.close()
        shutdown_pipelines()
        recorder.kill()


def section(result: DiskFullResult) -> str:
    refusals = "\n".join(f"  - `{detail}`" for detail in sorted(result.refusal_details)) or "  - (none)"
    return f"""## Full disk

The recorder's data folder on a 64 MiB tmpfs, filled with a ballast file until ENOSPC, while it runs.

| figure | value |
|---|---:|
| requests sent while full ({REQUEST_RECORDS} records of 2 KB each) | {result.requests_while_full} |
| refused | {result.refused} |
| reads answered while full (events, SQL) | {result.reads_while_full} of 2 |
| a 3-step recorded agent run while full | {result.agent_seconds_while_full:.2f} s, finished |
| that run's records, complete and once each after recovery | {"yes" if result.agent_trail_complete else "**no**"} |
| recovery after space returned (refused requests re-sent, agent journal drained) | {result.recovery_seconds:.2f} s |
| step events sent (before, while, after) / stored | {result.records_expected} / {result.records_stored} |
| duplicates | {result.duplicates} |
| recorder alive at the end | {"yes" if result.recorder_alive else "**no**"} |

Statuses of the refused requests:
{refusals}
"""


async def _run() -> str:
    try:
        with small_disk() as folder:
            return section(await disk_full(folder))
    except MountRefused as refused:
        return f"## Full disk\n\nNot run: {refused}. It needs root (or CAP_SYS_ADMIN) for a tmpfs.\n"


def main(quick: bool = False) -> str:
    """The same scenario at both sizes: it is short, and a full disk needs no longer run to show."""
    return asyncio.run(_run())
