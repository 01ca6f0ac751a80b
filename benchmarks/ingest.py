"""Recorder ingest: records per second and Export latency, from a load generator in another process.

The recorder runs as its own process (`RecorderProcess`); this process sends
pre-encoded OTLP requests of 512 small step events each over loopback, from 1
and from 4 threads, each on its own channel. "Acknowledged" counts records
whose Export was answered (committed to the write-ahead log); "applied" also
waits until they are in DuckDB and readable, through a query that cannot be
answered before then.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
from steprec.query import RecorderClient
from steprec.recorder.process import RecorderProcess

from benchmarks.load import step_events_request
from benchmarks.overhead import _machine

RECORDS_PER_REQUEST = 512
TARGET_RECORDS_PER_SECOND = 40_000


def _request(sender: int, number: int) -> bytes:
    return step_events_request(sender, number, RECORDS_PER_REQUEST).SerializeToString()


def _run_once(senders: int, requests_per_sender: int) -> dict[str, float]:
    payloads = [[_request(s, n) for n in range(requests_per_sender)] for s in range(senders)]
    latencies: list[float] = []
    with tempfile.TemporaryDirectory() as folder, RecorderProcess(Path(folder)) as recorder:

        def send(sender: int) -> None:
            channel = grpc.insecure_channel(recorder.endpoint)
            export = channel.unary_unary("/opentelemetry.proto.collector.logs.v1.LogsService/Export")
            for payload in payloads[sender]:
                started = time.perf_counter()
                export(payload, timeout=60)
                latencies.append(time.perf_counter() - started)

        threads = [threading.Thread(target=send, args=(s,)) for s in range(senders)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        acknowledged = time.perf_counter() - started

        async def read_after_apply() -> None:
            async with RecorderClient(recorder.endpoint, timeout_seconds=120) as client:
                await client.get_run("load-0")

        asyncio.run(read_after_apply())
        applied = time.perf_counter() - started
    records = senders * requests_per_sender * RECORDS_PER_REQUEST
    latencies.sort()
    return {
        "acknowledged": records / acknowledged,
        "applied": records / applied,
        "p50": latencies[len(latencies) // 2] * 1000,
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
    }


def main(quick: bool = False) -> str:
    repeats, requests = (2, 40) if quick else (3, 120)
    rows = []
    for senders in (1, 4):
        runs = []
        for repeat in range(repeats):
            runs.append(_run_once(senders, requests))
            print(f"[ingest] {senders} sender(s): repeat {repeat + 1}/{repeats} done", file=sys.stderr, flush=True)
        rows.append((senders, {key: [run[key] for run in runs] for key in runs[0]}))
    lines = [
        "# Recorder ingest" + (" (quick)" if quick else ""),
        "",
        f"Machine: {_machine()}",
        "",
        f"{RECORDS_PER_REQUEST} small step events per request, {requests} requests per sender; median of {repeats} "
        "runs (min-max), each on a fresh recorder.",
        "",
        "| senders | acknowledged records/s | applied records/s | Export p50 ms | Export p99 ms |",
        "|---:|---:|---:|---:|---:|",
    ]
    for senders, values in rows:
        cells = [
            f"{statistics.median(values[key]):,.{0 if key in ('acknowledged', 'applied') else 1}f} "
            f"({min(values[key]):,.0f}-{max(values[key]):,.0f})"
            for key in ("acknowledged", "applied", "p50", "p99")
        ]
        lines.append(f"| {senders} | " + " | ".join(cells) + " |")
    best_applied = max(statistics.median(values["applied"]) for _, values in rows)
    best_acked = max(statistics.median(values["acknowledged"]) for _, values in rows)
    lines += [
        "",
        f"- target: at least {TARGET_RECORDS_PER_SECOND:,} records/s end to end: acknowledged {best_acked:,.0f}/s -> "
        f"**{'MET' if best_acked >= TARGET_RECORDS_PER_SECOND else 'NOT MET'}**; applied to DuckDB "
        f"{best_applied:,.0f}/s -> **{'MET' if best_applied >= TARGET_RECORDS_PER_SECOND else 'NOT MET'}**",
    ]
    report = "\n".join(lines) + "\n"
    print(report, flush=True)
    return report
