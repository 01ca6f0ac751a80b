"""What the measurements share: the benchmark agent, the machine's facts, spreads of repeated runs, progress."""

from __future__ import annotations

import asyncio
import gc
import math
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from string import ascii_lowercase
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOOL_RETURN_CHARS = 2048
PACKAGES = ("pydantic-ai-slim", "pydantic-ai-harness", "duckdb", "grpcio", "opentelemetry-sdk")


# -- the agent every agent-side measurement runs -------------------------------------------------


def payloads(steps: int) -> list[str]:
    """Distinct, text-like tool returns of exactly TOOL_RETURN_CHARS characters, the same in every run."""
    out = []
    for i in range(steps):
        rng = random.Random(i)
        words = " ".join("".join(rng.choices(ascii_lowercase, k=rng.randint(2, 9))) for _ in range(500))
        out.append(f"step {i}: {words}"[:TOOL_RETURN_CHARS])
    return out


def agent(
    tool_returns: list[str],
    capabilities: list[Any],
    on_step: Callable[[int], None] | None = None,
    think_seconds: float = 0.0,
) -> Any:
    """A FunctionModel agent that calls `fetch` once per step for len(tool_returns) steps, then answers.

    Responses carry usage, as a real model's do; without it FunctionModel estimates tokens over
    the whole history on every request, which would pad the baseline. `on_step(i)` is called as
    the tool of step i starts. `think_seconds` is how long each model request takes (a real
    model's latency spreads a run's records over time; without it a run is sent in few Exports).
    """
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage

    usage = RequestUsage(input_tokens=100, output_tokens=10)
    calls = iter(range(len(tool_returns) + 1))

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = next(calls)
        if step < len(tool_returns):
            return ModelResponse(parts=[ToolCallPart("fetch", {"step": step})], usage=usage)
        return ModelResponse(parts=[TextPart("done")], usage=usage)

    async def thinking_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await asyncio.sleep(think_seconds)
        return model(messages, info)

    built = Agent(FunctionModel(thinking_model if think_seconds else model), capabilities=capabilities)

    @built.tool_plain
    def fetch(step: int) -> str:
        if on_step is not None:
            on_step(step)
        return tool_returns[step]

    return built


async def timed_run(built: Any) -> tuple[float, Any]:
    """Seconds spent in `agent.run` (garbage collected beforehand, outside the clock), and its result."""
    from pydantic_ai.usage import UsageLimits

    gc.collect()
    start = time.perf_counter()
    result = await built.run("go", usage_limits=UsageLimits(request_limit=None))
    return time.perf_counter() - start, result


# -- repeated figures ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """Median, min and max of repeated figures."""

    median: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        values = list(values)
        return cls(statistics.median(values), min(values), max(values), len(values))

    def text(self, digits: int = 0, scale: float = 1.0, unit: str = "", signed: bool = False) -> str:
        """`median (min-max)`, or `value (1 run)` when there was one; `unit` follows the median."""
        median = f"{self.median * scale:{'+' if signed else ''},.{digits}f}{unit}"
        if self.count == 1:
            return f"{median} (1 run)"
        return f"{median} ({self.low * scale:,.{digits}f}-{self.high * scale:,.{digits}f})"


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..1)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(round(q * len(ordered), 9)) - 1)] if ordered else float("nan")


# -- facts about the run ---------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """The machine, interpreter, package versions and commit a measurement ran on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = "not installed"
    return {
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "packages": packages,
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def machine_text(facts: dict[str, Any]) -> str:
    """The machine and versions (what `run_text` adds is per measurement)."""
    packages = ", ".join(f"{name} {v}" for name, v in facts["packages"].items())
    return f"{facts['cpu']}, {facts['cores']} cores, {facts['system']}; Python {facts['python']}; {packages}"


def run_text(facts: dict[str, Any]) -> str:
    """The commit measured and how loaded the machine was as the measurement started."""
    commit = f"commit `{facts['commit']}`" + (" with uncommitted changes" if facts["dirty"] else "")
    return f"{commit}, load average {', '.join(f'{x:g}' for x in facts.get('load_average', []))} as it started"


def _git(*args: str) -> str:
    found = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else ""


# -- small helpers --------------------------------------------------------------------------------


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def settle(endpoint: str) -> None:
    """Deliver what a run left in flight (best-effort delivery does not wait) and wait until the recorder at
    `endpoint` has applied it to DuckDB, so that work does not fall into the time of whatever runs next."""
    from steprec.exporter._pipeline import _pipelines  # no public flush short of shutting the pipelines down
    from steprec.query import RecorderClient

    for pipeline in list(_pipelines.values()):
        pipeline.force_flush(30_000)
    async with RecorderClient(endpoint, timeout_seconds=120) as client:
        await client.list_runs(conversation_id="settle")  # a read waits until all acknowledged is applied


def progress(measurement: str, message: str) -> None:
    print(f"[{measurement}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class LongRun:
    """One finished agent run of `steps` steps in each kind of store, kept by one measurement for another."""

    steps: int
    harness_database: Path
    """A closed harness SqliteStepStore file holding that run and nothing else."""
    harness_seconds: float
    recorder_data: Path
    """A stopped recorder's data folder holding that run and nothing else."""
    recorder_seconds: float


@dataclass
class Workspace:
    """A scratch folder for one invocation of benchmarks/run.py, and what its measurements hand each other."""

    folder: Path
    long_runs: dict[int, LongRun] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """A performance target of an issue, what was measured against it, and whether it is met (None: not measured)."""

    issue: int
    target: str
    measured: str
    met: bool | None


def targets_table(targets: Iterable[Target | dict[str, Any]]) -> str:
    rows = ["| issue | target | measured | met? |", "|---:|---|---|---|"]
    for found in targets:
        t = found if isinstance(found, dict) else found.__dict__
        verdict = {True: "met", False: "**not met**", None: "not measured at the stated size"}[t["met"]]
        rows.append(f"| {t['issue']} | {t['target']} | {t['measured']} | {verdict} |")
    return "\n".join(rows) + "\n"


@dataclass(frozen=True)
class Outcome:
    """What a measurement returns: its figures (JSON-able), its targets, and markdown.

    `markdown` is benchmarks/results/<name>.md; `sections` are the blocks docs/benchmarks.md takes,
    by the name of their placeholder in benchmarks/template.md.
    """

    data: dict[str, Any]
    targets: list[Target]
    markdown: str
    sections: dict[str, str]
