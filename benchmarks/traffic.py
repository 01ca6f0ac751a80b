"""Recorder ingest of real agent traffic: the Exports real runs sent, replayed under fresh run ids.

Real runs are captured on the wire (`capture.py`: a 5-step run; a 50-step run with 2 KB tool
returns; a run continued from the first with `continue_run`; a fork of the second; an
orchestrator with a delegate; each model request taking 60 ms, as a real model's does, so
records reach the wire as agents send them). A recorder in its own process, fresh for each
phase, then takes:

- **unbatched**: 8 sender processes, each replaying the capture as the agents sent it (the same
  requests, in order, one at a time) under fresh run ids, again and again;
- **batched**: 2 sender processes, each sending the captured records 512 to a request, run ids
  fresh per copy, for a sustained period; "applied" waits until a read sees all of it.

Every replayed run carries messages the recorder already holds (the first replay stored them):
the common case of continued runs, forks and agents that share instructions and prompts. After
each phase the benchmark checks exactness: no valid record refused, replays of a whole run
suppressed, every message stored once, and reads of replayed runs equal to the original runs'.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from steprec.query import RecorderClient
from steprec.recorder.daemon.process import RecorderProcess

from benchmarks import capture
from benchmarks.common import Outcome, Spread, Target, Workspace, percentile, progress, targets_table

UNBATCHED_SENDERS = 8
BATCHED_SENDERS = 2
RECORDS_PER_REQUEST = 512
FULL = {"repeats": 3, "unbatched_seconds": 20.0, "batched_seconds": 60.0}
QUICK = {"repeats": 1, "unbatched_seconds": 8.0, "batched_seconds": 15.0}
TARGET_EXPORTS_PER_SECOND = 3_000
TARGET_P99_MS = 10.0
TARGET_BATCHED_RECORDS_PER_SECOND = 40_000
BLOCK_COPIES = 20
"""Copies of the capture in one batched block: a block is sent again and again under a new prefix each time."""


def _prefix(kind: str, sender: int, round_: int) -> bytes:
    """Eight bytes that make a replay's run ids unique: kind, sender, round."""
    return f"{kind}{sender}{round_:06d}".encode()


def _send(endpoint: str, folder: str, kind: str, sender: int, seconds: float, start, results) -> None:
    """One sender process: replay the capture (`kind` "u": as sent; "b": batched) until `seconds` have passed."""
    found = capture.load(Path(folder))
    requests_per_round = found.requests if kind == "u" else found.batched(BLOCK_COPIES, RECORDS_PER_REQUEST)
    records_per_round = found.records * (1 if kind == "u" else BLOCK_COPIES)
    channel = grpc.insecure_channel(endpoint)
    export = channel.unary_unary(capture.EXPORT)
    export(b"", timeout=30)  # connected before the clock starts
    latencies: list[float] = []
    rejected = rounds = 0
    windows: list[tuple[float, int]] = []  # (instant a round was acknowledged, records in it)
    start.wait()
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        for request in requests_per_round:
            request = request.replace(capture.PLACEHOLDER, _prefix(kind, sender, rounds))
            sent = time.perf_counter()
            answer = ExportLogsServiceResponse.FromString(export(request, timeout=60))
            latencies.append(time.perf_counter() - sent)
            rejected += answer.partial_success.rejected_log_records
        rounds += 1
        windows.append((time.perf_counter() - began, records_per_round))
    elapsed = time.perf_counter() - began
    if kind == "u":  # the first round again, whole: every record of it must be suppressed as a replay
        for request in requests_per_round:
            again = export(request.replace(capture.PLACEHOLDER, _prefix(kind, sender, 0)), timeout=60)
            rejected += ExportLogsServiceResponse.FromString(again).partial_success.rejected_log_records
    channel.close()
    results.put(
        {"sender": sender, "rounds": rounds, "records": rounds * records_per_round, "exports": len(latencies),
         "seconds": elapsed, "latencies": latencies, "rejected": rejected, "windows": windows}
    )  # fmt: skip


def _phase(
    endpoint: str, folder: Path, kind: str, senders: int, seconds: float, *, recorder: bool = True
) -> tuple[list[dict], float]:
    """Run `senders` sender processes at once; their results and the seconds until all was applied."""
    context = multiprocessing.get_context("spawn")
    start, results = context.Event(), context.Queue()
    processes = [
        context.Process(target=_send, args=(endpoint, str(folder), kind, s, seconds, start, results))
        for s in range(senders)
    ]
    for process in processes:
        process.start()
    time.sleep(3.0)  # let every sender load and connect (each waits for `start`)
    began = time.perf_counter()
    start.set()
    found = [results.get(timeout=seconds + 600) for _ in processes]
    for process in processes:
        process.join()
    if not recorder:
        return found, time.perf_counter() - began

    async def read_after_apply() -> None:
        async with RecorderClient(endpoint, timeout_seconds=600) as client:
            await client.get_run("settle")  # a read waits until all acknowledged is applied

    asyncio.run(read_after_apply())
    return found, time.perf_counter() - began


async def _reads(endpoint: str, run_ids: list[str]) -> list[tuple]:
    """What a reader sees of each run: events, latest snapshot's messages, tool effects, lineage."""
    out = []
    async with RecorderClient(endpoint, timeout_seconds=120) as client:
        for run_id in run_ids:
            run = await client.get_run(run_id)
            events = [(e.kind, e.step_index, e.tool_name) for e in await client.list_events(run_id)]
            snapshot = await client.latest_snapshot(run_id, include_interrupted=True)
            effects = [(e.tool_call_id, e.status) for e in await client.list_tool_effects(run_id)]
            out.append(
                (run.outcome, run.parent_run_id is not None, run.forked_from_run_id is not None, events,
                 snapshot.messages if snapshot else None, effects)
            )  # fmt: skip
    return out


def _message_rows(data: Path) -> tuple[int, int]:
    """Rows of `messages` and distinct digests among them, read from a stopped recorder's file."""
    with duckdb.connect(str(data / "steprec.duckdb"), read_only=True) as connection:
        return connection.execute("SELECT count(*), count(DISTINCT digest) FROM messages").fetchone()


def _exact(endpoint: str, found: capture.Capture, expected: list[tuple], results: list[dict], kind: str) -> list[str]:
    """What went wrong: refused records, or replayed runs read differently from the originals."""
    problems = [f"sender {r['sender']}: {r['rejected']} records refused" for r in results if r["rejected"]]
    for result in results:
        for round_ in sorted({0, result["rounds"] - 1}):
            prefix = _prefix(kind, result["sender"], round_)
            runs = found.replayed_runs(prefix)
            if kind == "b":
                runs = [run.replace("-0000-", f"-{copy:04x}-") for copy in (0, BLOCK_COPIES - 1) for run in runs]
            seen = asyncio.run(_reads(endpoint, runs))
            if seen != expected * (1 if kind == "u" else 2):
                problems.append(f"replay {prefix.decode()} reads differently from the original runs")
    return problems


def _serve_nothing(ports) -> None:
    """A gRPC server (grpc.aio, as the recorder's) whose Export answers at once and keeps nothing."""

    async def serve() -> None:
        async def export(request: bytes, context) -> bytes:
            return b""

        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    capture.SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(export)}
                )
            ]
        )
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


def floor(folder: Path, seconds: float) -> dict[str, float]:
    """The unbatched phase against a server that does nothing: what this machine allows senders and gRPC."""
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    server = context.Process(target=_serve_nothing, args=(ports,), daemon=True)
    server.start()
    try:
        endpoint = f"127.0.0.1:{ports.get(timeout=60)}"
        results, _ = _phase(endpoint, folder / "capture", "u", UNBATCHED_SENDERS, seconds, recorder=False)
    finally:
        server.kill()
    latencies = [x for r in results for x in r["latencies"]]
    return {
        "exports_per_second": len(latencies) / max(r["seconds"] for r in results),
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def _run_once(found: capture.Capture, expected: list[tuple], messages: int, folder: Path, config: dict) -> dict:
    row: dict[str, Any] = {}
    for kind, senders, seconds in (
        ("u", UNBATCHED_SENDERS, config["unbatched_seconds"]),
        ("b", BATCHED_SENDERS, config["batched_seconds"]),
    ):
        with tempfile.TemporaryDirectory(dir=folder) as data:
            with RecorderProcess(Path(data)) as recorder:
                results, applied = _phase(recorder.endpoint, folder / "capture", kind, senders, seconds)
                problems = _exact(recorder.endpoint, found, expected, results, kind)
            rows, distinct = _message_rows(Path(data))
        if rows != distinct or distinct != messages:
            problems.append(f"{rows} message rows for {distinct} distinct messages; the original runs hold {messages}")
        latencies = [x for r in results for x in r["latencies"]]
        sent = max(r["seconds"] for r in results)
        records = sum(r["records"] for r in results)
        slowest_window = min(
            records_in / (end - begin)
            for r in results
            for (begin, _), (end, records_in) in zip([(0.0, 0), *r["windows"]], r["windows"], strict=False)
            if end > begin
        )
        phase = row["unbatched" if kind == "u" else "batched"] = {
            "exports_per_second": len(latencies) / sent,
            "acknowledged": records / sent,
            "applied": records / applied,
            "p50_ms": percentile(latencies, 0.5) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000,
            "slowest_round_per_sender": slowest_window,
            "problems": problems,
        }
        progress(
            "traffic",
            f"{kind}: {phase['exports_per_second']:,.0f} Exports/s, {phase['acknowledged']:,.0f} records/s "
            f"acknowledged, {phase['applied']:,.0f} applied, p99 {phase['p99_ms']:.1f} ms; "
            f"problems: {problems or 'none'}",
        )
    return row


def measure(quick: bool, folder: Path) -> dict[str, Any]:
    config = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(dir=folder) as data:
        with RecorderProcess(Path(data)) as recorder:
            found = capture.capture(recorder.endpoint)
            expected = asyncio.run(_reads(recorder.endpoint, _original_ids(recorder.endpoint, len(found.runs))))
        messages = _message_rows(Path(data))[1]
    capture.save(found, folder / "capture")
    progress("traffic", f"captured {len(found.requests)} Exports, {found.records} records, {len(found.runs)} runs")
    runs = [_run_once(found, expected, messages, folder, config) for _ in range(config["repeats"])]
    floors = [floor(folder, config["unbatched_seconds"]) for _ in range(config["repeats"])]
    progress("traffic", f"floor: {statistics.median(f['exports_per_second'] for f in floors):,.0f} Exports/s")
    return {
        "floors": floors,
        "exports": len(found.requests),
        "records": found.records,
        "runs": len(found.runs),
        "bytes": sum(map(len, found.requests)),
        "config": config,
        "rows": runs,
    }


def _original_ids(endpoint: str, count: int) -> list[str]:
    """The captured runs' own ids, in start order (the order their template ids were given)."""

    async def listed() -> list[str]:
        async with RecorderClient(endpoint) as client:
            return [run.run_id for run in await client.list_runs()]

    ids = asyncio.run(listed())
    if len(ids) != count:
        raise RuntimeError(f"the capture names {count} runs but the recorder holds {len(ids)}")
    return ids


def _spreads(data: dict[str, Any], phase: str) -> dict[str, Spread]:
    rows = [run[phase] for run in data["rows"]]
    return {key: Spread.of(row[key] for row in rows) for key in rows[0] if key != "problems"}


def table(data: dict[str, Any]) -> str:
    config = data["config"]
    unbatched, batched = _spreads(data, "unbatched"), _spreads(data, "batched")
    problems = [p for run in data["rows"] for phase in ("unbatched", "batched") for p in run[phase]["problems"]]
    return (
        "\n".join(
            [
                f"The capture: {data['exports']} Exports, {data['records']} records, {data['runs']} runs, "
                f"{data['bytes']:,} bytes. Median of {len(data['rows'])} runs (min-max), each phase on a fresh "
                "recorder.",
                "",
                "| phase | senders | Exports/s | acknowledged records/s | applied records/s | Export p50 ms "
                "| Export p99 ms |",
                "|---|---:|---:|---:|---:|---:|---:|",
                f"| unbatched, as sent, {config['unbatched_seconds']:g} s | {UNBATCHED_SENDERS} "
                f"| {unbatched['exports_per_second'].text()} | {unbatched['acknowledged'].text()} "
                f"| {unbatched['applied'].text()} | {unbatched['p50_ms'].text(1)} | {unbatched['p99_ms'].text(1)} |",
                f"| batched {RECORDS_PER_REQUEST}/request, {config['batched_seconds']:g} s | {BATCHED_SENDERS} "
                f"| {batched['exports_per_second'].text()} | {batched['acknowledged'].text()} "
                f"| {batched['applied'].text()} | {batched['p50_ms'].text(1)} | {batched['p99_ms'].text(1)} |",
                "",
                f"Slowest round of one batched sender: {batched['slowest_round_per_sender'].text()} records/s. "
                + (EXACT if not problems else "Exactness problems: " + "; ".join(problems)),
            ]
        )
        + "\n"
    )


def _floor_median(data: dict[str, Any]) -> float:
    return statistics.median(f["exports_per_second"] for f in data.get("floors", [])) if "floors" in data else 0.0


def _floor_row(data: dict[str, Any]) -> list[str]:
    """The same 8 senders against a server that answers at once: the most this machine allows."""
    if "floors" not in data:
        return []
    found = {key: Spread.of(f[key] for f in data["floors"]) for key in data["floors"][0]}
    return [
        f"| floor: unbatched against a gRPC server that does nothing | {UNBATCHED_SENDERS} "
        f"| {found['exports_per_second'].text()} | | | {found['p50_ms'].text(1)} | {found['p99_ms'].text(1)} |"
    ]


EXACT = (
    "Exactness: every check held (nothing refused, replays suppressed, each message stored once, "
    "replayed runs read as the originals)."
)


def targets(data: dict[str, Any]) -> list[Target]:
    unbatched, batched = _spreads(data, "unbatched"), _spreads(data, "batched")
    exact = not any(run[phase]["problems"] for run in data["rows"] for phase in ("unbatched", "batched"))
    return [
        Target(19, f"unbatched real traffic from {UNBATCHED_SENDERS} senders: at least {TARGET_EXPORTS_PER_SECOND:,} "
                   f"Exports/s, p99 at most {TARGET_P99_MS:g} ms",
               f"{unbatched['exports_per_second'].median:,.0f} Exports/s, p99 {unbatched['p99_ms'].median:.1f} ms "
            f"(a server that does nothing: {_floor_median(data):,.0f} Exports/s from the same senders)",
               unbatched["exports_per_second"].median >= TARGET_EXPORTS_PER_SECOND
               and unbatched["p99_ms"].median <= TARGET_P99_MS),
        Target(19, f"batched real traffic from {BATCHED_SENDERS} senders: at least "
                   f"{TARGET_BATCHED_RECORDS_PER_SECOND:,} records/s acknowledged and applied, sustained",
               f"{batched['acknowledged'].median:,.0f} acknowledged, {batched['applied'].median:,.0f} applied "
               f"over {data['config']['batched_seconds']:g} s",
               None if data["config"]["batched_seconds"] < 60
               else min(batched["acknowledged"].median, batched["applied"].median)
               >= TARGET_BATCHED_RECORDS_PER_SECOND),
        Target(19, "replays suppressed, nothing valid refused, each message stored once, reads equal the originals'",
               "every check held" if exact else "problems: see above", exact),
    ]  # fmt: skip


def main(quick: bool, workspace: Workspace) -> Outcome:
    data = measure(quick, workspace.folder)
    found = targets(data)
    markdown = "\n".join(
        [f"# Real agent traffic{' (quick)' if quick else ''}", "", __doc__.split("\n", 2)[2], table(data),
         targets_table(found)]
    )  # fmt: skip
    print(markdown, flush=True)
    return Outcome(data=data, targets=found, markdown=markdown, sections={"traffic": table(data)})
