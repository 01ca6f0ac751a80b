"""Delivery under faults: what an agent pays per step while the recorder is down and while it catches up.

Three runs of the same agent (benchmarks/common.py: one tool call per step, 2048-character tool
returns), interleaved over the repeats:

- `none`: no capability;
- `steprec`: StepRecorder in its default durable mode, its recorder up all along;
- `outage`: StepRecorder pointed at a loopback port nothing listens on. As the run starts, a
  recorder begins starting on that port (in a thread), as after a crash and restart: the first
  steps find no recorder and their records go to the disk journal; once it listens, the delivery
  thread re-sends the journal while the agent goes on (catching up); after that, records are
  acknowledged again.

Each tool call stamps the time, so every step's duration is known (from one tool call to the
next: the hooks, the model request, the tool). A step costs more the longer the history, so a
step of `outage` or `steprec` is compared with the same step of `none` in the same repeat. After
each outage run the pipeline is flushed and the recorder is asked whether it holds every record
of the run exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from steprec.exporter import StepRecorder, shutdown_pipelines
from steprec.query import RecorderClient
from steprec.recorder.daemon.process import RecorderProcess

from benchmarks.common import (
    Outcome,
    Spread,
    Target,
    Workspace,
    agent,
    free_port,
    payloads,
    progress,
    settle,
    targets_table,
    timed_run,
)

FULL = {"steps": 500, "repeats": 3}
QUICK = {"steps": 250, "repeats": 2}
PHASES = {"down": "recorder down, journaling", "catch-up": "recorder back, journal re-sent", "after": "caught up"}
POLL_SECONDS = 0.01
NOISY_LOGGERS = ("opentelemetry.exporter", "steprec.exporter")
"""An export to a port nothing listens on is logged as an error per attempt; the outage is on purpose here."""


def _journaled_bytes(journal: Path) -> int:
    """Bytes in the journal's segment files; a segment is deleted once everything in it was delivered."""
    total = 0
    for path in journal.glob("journal-*.log"):
        with suppress(FileNotFoundError):  # delivered and deleted meanwhile
            total += path.stat().st_size
    return total


class Outage:
    """A recorder that starts listening on `endpoint` some time after `begin()`, and when the journal was re-sent.

    A thread starts the recorder process, notes when it listens and how much was journaled by then, and
    polls the journal folder until it is empty.
    """

    def __init__(self, folder: Path) -> None:
        self.endpoint = f"127.0.0.1:{free_port()}"
        self.journal = folder / "journal"
        self.recorder = RecorderProcess(folder / "recorder", listen=self.endpoint)
        self.up_at: float | None = None
        self.drained_at: float | None = None
        self.journaled_bytes = 0
        self._watching = True
        self._thread = threading.Thread(target=self._restart, daemon=True)

    def begin(self) -> None:
        if self._thread.ident is None:
            self._thread.start()

    def _restart(self) -> None:
        self.recorder.start()
        self.up_at = time.perf_counter()
        self.journaled_bytes = _journaled_bytes(self.journal)
        while self._watching and _journaled_bytes(self.journal):
            time.sleep(POLL_SECONDS)
        if self._watching:
            self.drained_at = time.perf_counter()

    def stop_watching(self) -> None:
        """After the run: wait for the recorder to listen, stop polling (the flush that follows times the rest)."""
        self._watching = False
        self._thread.join()


@contextmanager
def _quiet() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


async def _stamped_run(steps: int, capabilities: list[Any], on_step: Any = None) -> tuple[list[float], Any]:
    """The time each tool call started at, and the run's result."""
    stamps: list[float] = []

    def stamp(step: int) -> None:
        stamps.append(time.perf_counter())
        if on_step is not None:
            on_step(step)

    _, result = await timed_run(agent(payloads(steps), capabilities, on_step=stamp))
    return stamps, result


async def _settled(run: Awaitable[Any], endpoint: str) -> Any:
    """The run's result, once the recorder at `endpoint` has applied it (its applier would slow the next run)."""
    result = await run
    await settle(endpoint)
    return result


async def _outage_run(folder: Path, steps: int) -> dict[str, Any]:
    outage = Outage(folder)
    recorder = StepRecorder(endpoint=outage.endpoint, journal_dir=outage.journal)
    try:
        stamps, _ = await _stamped_run(steps, [recorder], on_step=lambda step: outage.begin())
        outage.stop_watching()
        assert outage.up_at is not None, "the recorder did not come up during the run"
        flushed = time.perf_counter()
        shutdown_pipelines()  # answers what is pending and drains the rest of the journal
        if outage.drained_at is None and not _journaled_bytes(outage.journal):
            outage.drained_at = time.perf_counter()
        facts = {
            "stamps": stamps,
            "up_at": outage.up_at,
            "drained_at": outage.drained_at,
            "drained_after_run": outage.drained_at is not None and outage.drained_at >= flushed,
            "journaled_bytes": outage.journaled_bytes,
            "delivered": await _delivered(outage.endpoint, steps),
        }
    finally:
        shutdown_pipelines()
        outage.recorder.stop(timeout=60)
    return facts


async def _delivered(endpoint: str, steps: int) -> str:
    """'' when the recorder holds the whole run exactly once, else what is wrong."""
    async with RecorderClient(endpoint, timeout_seconds=60) as client:
        runs = [run.run_id for run in await client.list_runs()]
        if len(runs) != 1:
            return f"expected one run, found {len(runs)}"
        events = await client.list_events(runs[0])
        kinds = [event.kind for event in events]
        keys = [event.idempotency_key for event in events]
        if kinds.count("tool_call_completed") != steps or kinds[-1:] != ["run_completed"]:
            return f"{kinds.count('tool_call_completed')} of {steps} tool calls, last event {kinds[-1:]}"
        if len(keys) != len(set(keys)):
            return "some events are stored twice"
        snapshot = await client.latest_snapshot(runs[0])
        if snapshot is None or len(snapshot.messages) != 2 + 2 * steps:
            return "the newest snapshot is not the whole run"
    return ""


async def _measure(quick: bool, folder: Path) -> dict[str, Any]:
    config = QUICK if quick else FULL
    steps, repeats = config["steps"], config["repeats"]
    out: dict[str, Any] = {"steps": steps, "repeats": []}
    with RecorderProcess(folder / "steady") as steady, _quiet():

        def recorded() -> list[Any]:
            return [StepRecorder(endpoint=steady.endpoint, journal_dir=folder / "steady-journal")]

        variants = {
            "none": lambda r: _stamped_run(steps, []),
            "steprec": lambda r: _settled(_stamped_run(steps, recorded()), steady.endpoint),
            "outage": lambda r: _outage_run(folder / f"outage-{r}", steps),
        }
        await _stamped_run(5, [])  # warm up: imports, first connections, the recorder's first writes
        await _stamped_run(5, recorded())
        names = list(variants)
        for repeat in range(repeats):
            found: dict[str, Any] = {}
            for name in names[repeat % 3 :] + names[: repeat % 3]:
                await asyncio.sleep(0.2)
                value = await variants[name](repeat)
                found[name] = value if name == "outage" else {"stamps": value[0]}
            out["repeats"].append(found)
            progress("faults", f"repeat {repeat + 1}/{repeats} done")
        shutdown_pipelines()
    return out


# -- figures -------------------------------------------------------------------------------------


def step_seconds(stamps: list[float]) -> list[float]:
    """Duration of steps 1..N-1: from one tool call to the next."""
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def phase_of(stamp: float, up_at: float, drained_at: float | None) -> str:
    if stamp < up_at:
        return "down"
    return "catch-up" if drained_at is None or stamp < drained_at else "after"


def phase_figures(repeat: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per phase of the outage run: steps in it, and mean added ms/step against `none` at the same steps, for
    the outage run and for `steprec` with its recorder up."""
    outage = repeat["outage"]
    base = step_seconds(repeat["none"]["stamps"])
    runs = {"outage": step_seconds(outage["stamps"]), "steprec": step_seconds(repeat["steprec"]["stamps"])}
    out: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        steps = [
            i
            for i, stamp in enumerate(outage["stamps"][:-1])  # duration i runs from tool call i to i + 1
            if phase_of(stamp, outage["up_at"], outage["drained_at"]) == phase
        ]
        figures: dict[str, float] = {"steps": len(steps)}
        if steps:
            figures["none_ms"] = statistics.mean(base[i] for i in steps) * 1000
            for name, durations in runs.items():
                figures[name] = statistics.mean(durations[i] - base[i] for i in steps) * 1000
            figures["longest_ms"] = max(runs["outage"][i] for i in steps) * 1000
        out[phase] = figures
    return out


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """Per phase, spreads over the repeats; and the outage's own facts."""
    per_repeat = [phase_figures(repeat) for repeat in data["repeats"]]
    phases = {}
    for phase in PHASES:
        present = [figures[phase] for figures in per_repeat if figures[phase]["steps"]]
        phases[phase] = {
            key: Spread.of(figures[key] for figures in present) if present else None
            for key in ("steps", "none_ms", "outage", "longest_ms", "steprec")
        }
    outages = [repeat["outage"] for repeat in data["repeats"]]
    return {
        "phases": phases,
        "down_seconds": Spread.of(o["up_at"] - o["stamps"][0] for o in outages),
        "drain_seconds": Spread.of(o["drained_at"] - o["up_at"] for o in outages if o["drained_at"] is not None),
        "drained_after_run": sum(o["drained_after_run"] for o in outages),
        "journaled_bytes": Spread.of(o["journaled_bytes"] for o in outages),
        "failures": [o["delivered"] for o in outages if o["delivered"]],
    }


def _cell(spread: Spread | None, digits: int = 2, signed: bool = False) -> str:
    return "no step" if spread is None else spread.text(digits, signed=signed)


def tables(data: dict[str, Any]) -> str:
    found, repeats = summary(data), len(data["repeats"])
    lines = [
        f"{data['steps']}-step runs, {repeats} interleaved repeats. Each cell is the median over the repeats "
        "(min-max) of a figure of that phase's steps: their count, their mean time in `none`, the mean of (step time "
        "- the same step's time in `none`), and the longest step of the outage run. A step belongs to the phase "
        "its tool call started in.",
        "",
        "| phase of the outage run | steps in it | `none` ms/step | outage run: added ms/step "
        "| outage run: longest step, ms | `steprec`, recorder up, same steps: added ms/step |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for phase, label in PHASES.items():
        figures = found["phases"][phase]
        lines.append(
            f"| {label} | {_cell(figures['steps'], 0)} | {_cell(figures['none_ms'])} "
            f"| {_cell(figures['outage'], signed=True)} | {_cell(figures['longest_ms'], 0)} "
            f"| {_cell(figures['steprec'], signed=True)} |"
        )
    drain = found["drain_seconds"]
    lines += [
        "",
        f"The recorder took {found['down_seconds'].text(2)} s from the run's first step to listening; by then the "
        f"journal held {found['journaled_bytes'].text(0)} bytes. Re-sending it took {drain.text(2)} s from the moment "
        "the recorder listened"
        + (
            f" ({found['drained_after_run']} of {repeats} runs finished before the journal was empty; the flush after "
            "the run drained the rest)"
            if found["drained_after_run"]
            else ""
        )
        + ". "
        + (
            "Afterwards the recorder held every record of every outage run exactly once."
            if not found["failures"]
            else f"**Records missing or doubled after the outage**: {'; '.join(found['failures'])}."
        ),
    ]
    return "\n".join(lines) + "\n"


def targets(data: dict[str, Any]) -> list[Target]:
    failures, runs = summary(data)["failures"], len(data["repeats"])
    return [
        Target(
            3,
            "the recorder being down or restarting never fails or hangs the agent run, and loses nothing",
            f"{runs} of {runs} outage runs finished; "
            + (f"records missing or doubled in {len(failures)}" if failures else "every record stored exactly once"),
            not failures,
        )
    ]


def main(quick: bool, workspace: Workspace) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="bench-faults-", dir=workspace.folder) as tmp:
        data = asyncio.run(_measure(quick, Path(tmp)))
    found = targets(data)
    sections = {"faults": tables(data)}
    title = f"# Delivery under faults{' (quick)' if quick else ''}"
    markdown = "\n".join([title, "", __doc__.split("\n", 2)[2], sections["faults"], targets_table(found)])
    print(markdown, flush=True)
    return Outcome(data=data, targets=found, markdown=markdown, sections=sections)
