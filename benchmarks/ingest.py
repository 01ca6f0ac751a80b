"""Recorder ingest: records per second and Export latency, from a load generator in another process.

The recorder runs as its own process (`RecorderProcess`, a fresh one per run); this process
sends pre-encoded OTLP requests of 512 small step events each over loopback, from 1 and from 4
threads, each on its own channel. "Acknowledged" counts records whose Export was answered
(committed to the write-ahead log); "applied" also waits until they are in DuckDB and readable,
through a query that cannot be answered before then.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from steprec.query import RecorderClient
from steprec.recorder.daemon.process import RecorderProcess

from benchmarks.common import Outcome, Spread, Target, Workspace, percentile, progress, targets_table
from benchmarks.load import step_events_request

RECORDS_PER_REQUEST = 512
SENDERS = (1, 4)
FULL = {"repeats": 3, "requests": 120}
QUICK = {"repeats": 2, "requests": 40}
TARGET_RECORDS_PER_SECOND = 60_000
TARGET_ISSUE = 19
"""Issue 4 asked 40,000 records/s of these synthetic events; issue 19 raised it to 60,000."""
EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


def send_in_threads(payloads: list[list[bytes]], endpoint: Callable[[int], str], latencies: list[float]) -> float:
    """Each sender's requests from a thread of its own, one at a time, to `endpoint(sender)`; the seconds until all
    were answered. Each request's latency is added to `latencies`."""

    def send(sender: int) -> None:
        with grpc.insecure_channel(endpoint(sender)) as channel:
            export = channel.unary_unary(EXPORT)
            for payload in payloads[sender]:
                started = time.perf_counter()
                export(payload, timeout=120)
                latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=send, args=(s,)) for s in range(len(payloads))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def _run_once(payloads: list[list[bytes]], folder: Path, extra_args: tuple[str, ...] = ()) -> dict[str, float]:
    """One fresh recorder (`extra_args` added to its command: benchmarks/lake.py passes --lake) under `payloads`."""
    latencies: list[float] = []
    with (
        tempfile.TemporaryDirectory(dir=folder) as data,
        RecorderProcess(Path(data), extra_args=extra_args) as recorder,
    ):
        started = time.perf_counter()
        acknowledged = send_in_threads(payloads, lambda sender: recorder.endpoint, latencies)

        async def read_after_apply() -> None:
            async with RecorderClient(recorder.endpoint, timeout_seconds=120) as client:
                await client.get_run("load-0")

        asyncio.run(read_after_apply())
        applied = time.perf_counter() - started
    records = sum(map(len, payloads)) * RECORDS_PER_REQUEST
    return {
        "acknowledged": records / acknowledged,
        "applied": records / applied,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def measure(quick: bool, folder: Path) -> dict[str, Any]:
    config = QUICK if quick else FULL
    rows = []
    for senders in SENDERS:
        payloads = [
            [
                step_events_request(f"load-{s}", n, RECORDS_PER_REQUEST).SerializeToString()
                for n in range(config["requests"])
            ]
            for s in range(senders)
        ]
        runs = []
        for repeat in range(config["repeats"]):
            runs.append(_run_once(payloads, folder))
            progress("ingest", f"{senders} sender(s): repeat {repeat + 1}/{config['repeats']} done")
        rows.append({"senders": senders, "runs": runs})
    return {"records_per_request": RECORDS_PER_REQUEST, "requests_per_sender": config["requests"], "rows": rows}


def spreads(row: dict[str, Any]) -> dict[str, Spread]:
    return {key: Spread.of(run[key] for run in row["runs"]) for key in row["runs"][0]}


def table(data: dict[str, Any]) -> str:
    repeats = len(data["rows"][0]["runs"])
    lines = [
        f"{data['records_per_request']} small step events per request, {data['requests_per_sender']} requests per "
        f"sender; median of {repeats} runs (min-max), each on a fresh recorder.",
        "",
        "| senders | acknowledged records/s | applied records/s | Export p50 ms | Export p99 ms |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        found = spreads(row)
        lines.append(
            f"| {row['senders']} | {found['acknowledged'].text()} | {found['applied'].text()} "
            f"| {found['p50_ms'].text(1)} | {found['p99_ms'].text(1)} |"
        )
    return "\n".join(lines) + "\n"


def targets(data: dict[str, Any]) -> list[Target]:
    best = {key: max(spreads(row)[key].median for row in data["rows"]) for key in ("acknowledged", "applied")}
    return [
        Target(
            TARGET_ISSUE,
            f"at least {TARGET_RECORDS_PER_SECOND:,} records/s end to end",
            f"{best['acknowledged']:,.0f} acknowledged, {best['applied']:,.0f} applied to DuckDB (best median)",
            best["applied"] >= TARGET_RECORDS_PER_SECOND,
        )
    ]


def main(quick: bool, workspace: Workspace) -> Outcome:
    data = measure(quick, workspace.folder)
    found = targets(data)
    sections = {"ingest": table(data)}
    markdown = "\n".join(
        [
            f"# Recorder ingest{' (quick)' if quick else ''}",
            "",
            __doc__.split("\n", 2)[2],
            table(data),
            targets_table(found),
        ]
    )
    print(markdown, flush=True)
    return Outcome(data=data, targets=found, markdown=markdown, sections=sections)
