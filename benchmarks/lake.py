"""Lake mode beside file mode, in one run: ingest per recorder, two lake recorders at once, and the reads of
a recorder that did not write the run (issue 22). PostgreSQL and moto's S3 server run on this machine.

    .venv/bin/python -m benchmarks.lake [--quick]

It prints its table, which docs/lake.md quotes (benchmarks/run.py, which writes docs/benchmarks.md, leaves it out:
it needs PostgreSQL).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from pydantic_ai.usage import UsageLimits
from steprec.exporter import shutdown_pipelines
from steprec.query import RecorderClient, continue_run
from steprec.recorder.daemon.process import RecorderProcess

from benchmarks.common import machine, machine_text, percentile, run_text
from benchmarks.ingest import EXPORT, RECORDS_PER_REQUEST, _run_once, send_in_threads
from benchmarks.load import step_events_request
from tests.agents import echo_agent
from tests.lake_services import postgres, s3_server


def _payloads(senders: int, requests: int, tag: str, *, run_per_request: bool = False) -> list[list[bytes]]:
    """Each sender's requests: one run per sender, or with `run_per_request` a new run in every request (in a lake
    each new run is held in PostgreSQL: one more statement for that request)."""
    return [[step_events_request(f"{tag}-{s}" + (f"-{n}" if run_per_request else ""), n,
                                 RECORDS_PER_REQUEST).SerializeToString() for n in range(requests)]
            for s in range(senders)]  # fmt: skip


def _handoffs(first: RecorderProcess, second: RecorderProcess, runs: int) -> list[float]:
    """For each of `runs` runs: a request through `first`, then the next through `second`, sent again every 5 ms
    while it answers UNAVAILABLE (the run is moving); how long until `second` took it, in seconds."""
    import grpc

    waits = []
    with grpc.insecure_channel(first.endpoint) as one, grpc.insecure_channel(second.endpoint) as other:
        for run in range(runs):
            one.unary_unary(EXPORT)(step_events_request(f"moving-{run}", 0, 10).SerializeToString(), timeout=10)
            payload = step_events_request(f"moving-{run}", 1, 10).SerializeToString()
            started = time.perf_counter()
            while True:
                try:
                    other.unary_unary(EXPORT)(payload, timeout=10)
                    break
                except grpc.RpcError as error:
                    if error.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    time.sleep(0.005)
            waits.append(time.perf_counter() - started)
    return waits


def _together(recorders: list[RecorderProcess], requests: int) -> float:
    """Records per second acknowledged by `recorders` at once, two senders each."""
    payloads = _payloads(2 * len(recorders), requests, "pair")
    seconds = send_in_threads(payloads, lambda sender: recorders[sender % len(recorders)].endpoint, [])
    return sum(map(len, payloads)) * RECORDS_PER_REQUEST / seconds


async def _reads(writer: RecorderProcess, reader: RecorderProcess, steps: int, repeats: int) -> dict[str, float]:
    """A `steps`-step run and 200 short ones of one conversation written through `writer`, read through `reader`."""
    long_run = await echo_agent(writer.endpoint, calls=steps).run(
        "go", conversation_id="bench-long", usage_limits=UsageLimits(request_limit=None)
    )
    for _ in range(200):
        await echo_agent(writer.endpoint, calls=1).run("go", conversation_id="bench-conv")
    shutdown_pipelines()
    figures: dict[str, list[float]] = {"continue_run (new client)": [], "continue_run (same client)": [],
                                       "list_runs(conversation_id)": []}  # fmt: skip
    async with RecorderClient(reader.endpoint) as warm:
        while len(await warm.list_runs(conversation_id="bench-conv")) < 200:
            await asyncio.sleep(0.1)
        for _ in range(repeats):
            async with RecorderClient(reader.endpoint) as cold:
                started = time.perf_counter()
                history = await continue_run(cold, run_id=long_run.run_id)
                figures["continue_run (new client)"].append(time.perf_counter() - started)
            assert len(history) == len(long_run.all_messages())
            started = time.perf_counter()
            await continue_run(warm, run_id=long_run.run_id)
            figures["continue_run (same client)"].append(time.perf_counter() - started)
            started = time.perf_counter()
            await warm.list_runs(conversation_id="bench-conv")
            figures["list_runs(conversation_id)"].append(time.perf_counter() - started)
    return {name: percentile(values, 0.5) * 1000 for name, values in figures.items()}


def main(quick: bool) -> None:
    requests, steps, repeats = (20, 200, 10) if quick else (60, 1000, 30)
    folder = Path(tempfile.mkdtemp(prefix="steprec-bench-lake-"))
    facts = machine()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {run_text(facts)}", machine_text(facts), sep="\n")
    with postgres() as pg, s3_server("steprec") as s3:
        lake = ("--lake", f"postgres:{pg}", "--lake-data", "s3://steprec/lake", "--s3-endpoint-url", s3)
        rows = []
        for runs in ("one run per sender", "a new run per request"):
            for name, args in (("file", ()), ("lake", lake)):
                payloads = _payloads(4, requests, f"{name}-{len(rows)}", run_per_request=runs != "one run per sender")
                run = _run_once(payloads, folder, extra_args=args)
                rows.append((f"ingest, one {name} recorder, 4 senders, {runs}",
                             f"{run['acknowledged']:,.0f} acknowledged/s",
                             f"{run['applied']:,.0f} applied/s, Export p50 {run['p50_ms']:.1f} ms"))  # fmt: skip
        with RecorderProcess(folder / "file", ui_listen="off") as alone:  # the same reads in file mode, for scale
            for name, p50 in asyncio.run(_reads(alone, alone, steps, repeats)).items():
                rows.append((f"{name}, {steps}-step run / 200 runs, file mode", f"p50 {p50:.1f} ms",
                             f"{repeats} reads"))  # fmt: skip
        with RecorderProcess(folder / "a", ui_listen="off", extra_args=lake) as first, \
                RecorderProcess(folder / "b", ui_listen="off", extra_args=lake) as second:  # fmt: skip
            rate = _together([first, second], requests)
            rows.append(("ingest, two lake recorders at once, 2 senders each", f"{rate:,.0f} acknowledged/s", ""))
            waits = _handoffs(first, second, repeats)
            rows.append(("a run moving to the other recorder: until its records are taken there",
                         f"p50 {percentile(waits, 0.5) * 1000:.0f} ms", f"max {max(waits) * 1000:.0f} ms,"
                         f" {repeats} runs"))  # fmt: skip
            for name, p50 in asyncio.run(_reads(first, second, steps, repeats)).items():
                rows.append((f"{name}, {steps}-step run / 200 runs, from the recorder that did not write them",
                             f"p50 {p50:.1f} ms", f"{repeats} reads"))  # fmt: skip
    print("| measurement | figure | note |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    main(parser.parse_args().quick)
