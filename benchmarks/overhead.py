"""Agent overhead: what each step-persistence capability adds to the wall time of `agent.run`.

One pydantic-ai `FunctionModel` agent calls one tool per step, each returning
2048 characters of text, for N steps. Variants run interleaved (every repeat
runs every variant once, in rotating order) so machine drift cancels in the
paired ratios. Only `await agent.run(...)` is timed; each run gets a fresh
agent and a fresh store, built beforehand. Separately, one run per store and N
measures the bytes the store leaves on disk.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from string import ascii_lowercase
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage, UsageLimits
from pydantic_ai_harness.step_persistence import FileStepStore, InMemoryStepStore, SqliteStepStore, StepPersistence
from steprec.exporter import StepRecorder, shutdown_pipelines
from steprec.recorder.process import RecorderProcess

TOOL_RETURN_CHARS = 2048
WARMUP_STEPS = 5
SETTLE_SECONDS = 0.2  # between runs, untimed: lets background delivery of the previous run finish
FULL = {"sizes": [50, 200, 1000], "repeats": 5}
QUICK = {"sizes": [50, 200], "repeats": 3}
TARGETS = [  # the targets for steprec against `none`: (label, N, figure, upper limit)
    ("adds at most 10% to the no-capability time at N=200", 200, "ratio", 1.10),
    ("adds at most 1 ms per step at N=1000", 1000, "added", 1.0),
]
USAGE = RequestUsage(input_tokens=100, output_tokens=10)

Capabilities = Callable[[Path], list[Any]]
"""Given a fresh scratch folder for one run, the capabilities of that run's agent."""


@dataclass(frozen=True)
class Variant:
    name: str
    setup: Callable[[Path], AbstractContextManager[Capabilities]]
    """Given a scratch folder for one N, a context that lives for all runs at that N."""
    on_disk: bool = False
    max_steps: int | None = None
    skip_reason: str = ""


@contextmanager
def _no_store(_: Path) -> Iterator[Capabilities]:
    yield lambda run_dir: []


def _harness(make_store: Callable[[Path], Any]) -> Callable[[Path], AbstractContextManager[Capabilities]]:
    @contextmanager
    def setup(_: Path) -> Iterator[Capabilities]:
        yield lambda run_dir: [StepPersistence(store=make_store(run_dir))]

    return setup


@contextmanager
def _steprec(folder: Path) -> Iterator[Capabilities]:
    recorder = RecorderProcess(folder / "recorder-data").start()
    try:
        yield lambda run_dir: [StepRecorder(endpoint=recorder.endpoint)]
    finally:
        shutdown_pipelines()
        recorder.stop()


VARIANTS = [
    Variant("none", _no_store),
    Variant("harness-memory", _harness(lambda d: InMemoryStepStore())),
    Variant("harness-sqlite", _harness(lambda d: SqliteStepStore(database=d / "steps.sqlite")), on_disk=True),
    Variant(
        "harness-file",
        _harness(lambda d: FileStepStore(d / "steps")),
        on_disk=True,
        max_steps=200,
        skip_reason="FileStepStore re-reads every earlier snapshot file of the run on each save (O(N^3) bytes "
        "parsed per run), too slow to repeat at that size",
    ),
    Variant("steprec", _steprec, on_disk=True),
]


def _payloads(steps: int) -> list[str]:
    """Distinct, text-like tool returns of exactly TOOL_RETURN_CHARS characters, the same in every run."""
    out = []
    for i in range(steps):
        rng = random.Random(i)
        words = " ".join("".join(rng.choices(ascii_lowercase, k=rng.randint(2, 9))) for _ in range(500))
        out.append(f"step {i}: {words}"[:TOOL_RETURN_CHARS])
    return out


def _agent(payloads: list[str], capabilities: list[Any]) -> Agent:
    """Calls `fetch` once per step for len(payloads) steps, then answers.

    Responses carry usage, as a real model's do; without it FunctionModel estimates
    tokens over the whole history on every request, which would pad the baseline.
    """
    calls = iter(range(len(payloads) + 1))

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = next(calls)
        if step < len(payloads):
            return ModelResponse(parts=[ToolCallPart("fetch", {"step": step})], usage=USAGE)
        return ModelResponse(parts=[TextPart("done")], usage=USAGE)

    agent = Agent(FunctionModel(model), capabilities=capabilities)

    @agent.tool_plain
    def fetch(step: int) -> str:
        return payloads[step]

    return agent


async def _timed_run(payloads: list[str], capabilities: list[Any]) -> float:
    """Seconds spent in `agent.run`; the agent is built and the machine settled before the clock starts."""
    agent = _agent(payloads, capabilities)
    gc.collect()
    await asyncio.sleep(SETTLE_SECONDS)
    start = time.perf_counter()
    await agent.run("go", usage_limits=UsageLimits(request_limit=None))
    return time.perf_counter() - start


def _folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


async def _timings(variants: list[Variant], steps: int, repeats: int) -> dict[str, list[float]]:
    """Per variant, `repeats` run times at `steps` steps, run round-robin in rotating order."""
    payloads = _payloads(steps)
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix=f"bench-{steps}-") as tmp, ExitStack() as stack:
        setups = {v.name: stack.enter_context(v.setup(Path(tmp) / v.name)) for v in variants}

        async def run_once(name: str, payloads: list[str]) -> float:
            run_dir = Path(tempfile.mkdtemp(dir=tmp))
            try:
                return await _timed_run(payloads, setups[name](run_dir))
            finally:
                shutil.rmtree(run_dir)

        for name in setups:
            await run_once(name, payloads[:WARMUP_STEPS])
        names = list(setups)
        for repeat in range(repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in order:
                times[name].append(await run_once(name, payloads))
            medians = ", ".join(f"{name} {statistics.median(runs) * 1000:,.0f} ms" for name, runs in times.items())
            _progress(f"N={steps}: repeat {repeat + 1}/{repeats} done; medians so far: {medians}")
    return times


async def _stored_bytes(variant: Variant, steps: int) -> int:
    """Bytes a fresh store holds after one run of `steps` steps, with the store closed."""
    with tempfile.TemporaryDirectory(prefix=f"bench-store-{steps}-") as tmp:
        with variant.setup(Path(tmp) / "store") as capabilities:
            run_dir = Path(tmp) / "run"
            run_dir.mkdir()
            await _timed_run(_payloads(steps), capabilities(run_dir))
        return _folder_bytes(Path(tmp))


def _progress(message: str) -> None:
    print(f"[overhead] {message}", file=sys.stderr, flush=True)


def _machine() -> str:
    packages = ", ".join(
        f"{name} {version(name)}" for name in ("pydantic-ai-slim", "pydantic-ai-harness", "duckdb", "grpcio")
    )
    uname = subprocess.run(["uname", "-a"], capture_output=True, text=True).stdout.strip()
    return f"`{uname}`; {os.cpu_count()} CPUs; Python {platform.python_version()}; {packages}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}"


def _extrapolated(name: str, steps: int, timings: dict[int, dict[str, list[float]]]) -> str:
    """'; one run would take about X' from a power law through the two largest N measured for `name`."""
    measured = [(n, statistics.median(t[name])) for n, t in timings.items() if name in t]
    if len(measured) < 2:
        return ""
    (n1, t1), (n2, t2) = measured[-2:]
    exponent = math.log(t2 / t1) / math.log(n2 / n1)
    estimate = t2 * (steps / n2) ** exponent
    return f"; its medians ({t1:.1f} s at N={n1}, {t2:.1f} s at N={n2}) put one run at ~{estimate / 60:.0f} min"


def _report(
    quick: bool, repeats: int, timings: dict[int, dict[str, list[float]]], storage: dict[int, dict[str, int]]
) -> str:
    lines = [
        f"# Agent overhead{' (quick)' if quick else ''}",
        "",
        f"Machine: {_machine()}",
        "",
        f"One tool call per step, {TOOL_RETURN_CHARS}-char tool returns, FunctionModel. Median of {repeats} "
        "interleaved repeats (min-max). Added ms/step and ratio are medians of the per-repeat differences "
        "and ratios against `none` in the same repeat.",
        "",
        "| variant | N | total ms, median (min-max) | added ms/step vs none | ratio to none |",
        "|---|---:|---:|---:|---:|",
    ]
    summary: dict[tuple[str, int], dict[str, float]] = {}
    for steps, times in timings.items():
        base = times["none"]
        for name, runs in times.items():
            added = statistics.median((t - b) * 1000 / steps for t, b in zip(runs, base, strict=True))
            ratio = statistics.median(t / b for t, b in zip(runs, base, strict=True))
            summary[(name, steps)] = {"added": added, "ratio": ratio}
            lines.append(
                f"| {name} | {steps} | {_ms(statistics.median(runs))} ({_ms(min(runs))}-{_ms(max(runs))}) "
                f"| {added:+.2f} | {ratio:.2f}x |"
            )
    for variant in VARIANTS:
        for skipped in (n for n in timings if variant.max_steps is not None and n > variant.max_steps):
            lines += ["", f"`{variant.name}` skipped at N={skipped} (timing and storage): {variant.skip_reason}"
                      f"{_extrapolated(variant.name, skipped, timings)}."]  # fmt: skip
    lines += [
        "",
        "Bytes on disk after one run with a fresh store, the store closed (steprec: the recorder's data folder "
        "after `RecorderProcess.stop()`; harness-file: its directory):",
        "",
        "| store | N | bytes | bytes/step |",
        "|---|---:|---:|---:|",
    ]
    for steps, sizes in storage.items():
        lines += [f"| {name} | {steps} | {size:,} | {size / steps:,.0f} |" for name, size in sizes.items()]
    lines += ["", "Targets (steprec vs none):", ""]
    for label, steps, figure, limit in TARGETS:
        if ("steprec", steps) not in summary:
            lines.append(f"- {label}: not measured (N={steps} not run)")
            continue
        value = summary[("steprec", steps)][figure]
        shown = {"ratio": f"{value:.2f}x (limit {limit:.2f}x)", "added": f"{value:.2f} ms/step (limit {limit:g})"}
        lines.append(f"- {label}: {shown[figure]} -> **{'MET' if value <= limit else 'NOT MET'}**")
    return "\n".join(lines) + "\n"


async def _measure(quick: bool) -> str:
    config = QUICK if quick else FULL
    timings: dict[int, dict[str, list[float]]] = {}
    storage: dict[int, dict[str, int]] = {}
    for steps in config["sizes"]:
        variants = [v for v in VARIANTS if v.max_steps is None or steps <= v.max_steps]
        for variant in (v for v in variants if v.on_disk):
            _progress(f"N={steps}: one run of {variant.name} for its size on disk")
            storage.setdefault(steps, {})[variant.name] = await _stored_bytes(variant, steps)
        timings[steps] = await _timings(variants, steps, config["repeats"])
    return _report(quick, config["repeats"], timings, storage)


def main(quick: bool = False) -> str:
    """Run the measurement, print its table and return it (markdown)."""
    report = asyncio.run(_measure(quick))
    print(report, end="", flush=True)
    return report
