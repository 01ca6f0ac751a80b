"""Agent overhead and storage: what each step-persistence capability adds to `agent.run`, and leaves on disk.

One pydantic-ai `FunctionModel` agent calls one tool per step, each returning 2048 characters
of text, for N steps (benchmarks/common.py). Variants run interleaved (every repeat runs every
variant once, in rotating order) so machine drift cancels in the paired ratios. Only
`await agent.run(...)` is timed; each run gets a fresh agent and a fresh store, built beforehand.
The recorder of each steprec variant runs in its own process, one per variant and N, warmed up
by a 5-step run.

Storage: the harness's Sqlite and File stores are measured in each timed run's own folder after
the run. steprec's is one more run per N with a fresh recorder, stopped cleanly, then its whole
data folder; that recorder's folder and the harness's SQLite file of the first timed run are
kept for the reads measurement, which adds its bulk data to them. The distinct message bytes
are the pydantic-ai JSON of each distinct message of the finished run.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import statistics
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from pydantic import TypeAdapter
from pydantic_ai import CallToolsNode, ModelRequestNode
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pydantic_ai_harness.step_persistence import FileStepStore, InMemoryStepStore, SqliteStepStore, StepPersistence
from steprec.exporter import StepRecorder, shutdown_pipelines
from steprec.recorder.daemon.process import RecorderProcess
from steprec.recorder.daemon.server import DATABASE_NAME

from benchmarks.common import (
    TOOL_RETURN_CHARS,
    LongRun,
    Outcome,
    Spread,
    Target,
    Workspace,
    agent,
    folder_bytes,
    payloads,
    progress,
    settle,
    targets_table,
    timed_run,
)

WARMUP_STEPS = 5
SETTLE_SECONDS = 0.2  # between runs, untimed
# Per N: how many repeats, and the variants that run fewer times (0: not at all) because one run takes minutes.
FULL = {
    50: (5, {}),
    200: (5, {"harness-sqlite": 3, "harness-file": 3}),
    1000: (3, {"harness-memory": 1, "harness-sqlite": 1, "harness-file": 0}),
}
QUICK = {50: (3, {}), 200: (3, {"harness-memory": 1, "harness-sqlite": 1, "harness-file": 0})}
STEPREC = "steprec"
"""The default delivery mode, `journal`."""
ACKNOWLEDGED = "steprec-acknowledged"
FLOOR = "two-bare-acks"
WORK_FLOOR = "serialize-and-write"
ACK_FLOOR = "serialize-and-ack"
EXPORT_METHOD = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
EMPTY_EXPORT = b""  # an ExportLogsServiceRequest with no records
STORAGE_TARGET_N, STORAGE_TARGET_BYTES = 200, 1_500_000
LINEAR_SLOPE_GROWTH = 1.25
"""steprec's bytes on disk grow linearly if the bytes each added step costs from the middle N to the largest are at
most this many times those from the smallest N to the middle one (a store that grows with N^2 shows about 5x)."""


async def _nothing() -> None:
    pass


@dataclass(frozen=True)
class Session:
    """What lives for all runs of one variant at one N."""

    capabilities: Callable[[Path], list[Any]]
    """Given a fresh scratch folder for one run, the capabilities of that run's agent."""
    settle: Callable[[], Awaitable[None]] = _nothing
    """After a run, outside the clock: let the store finish the run's work before the next run is timed."""


@dataclass(frozen=True)
class Variant:
    name: str
    setup: Callable[[Path], AbstractContextManager[Session]]
    """Given a scratch folder for one N, a context that lives for all runs at that N."""
    on_disk: bool = False
    """Its store lives in the run's folder: measure the folder after each run."""
    skip_reason: str = ""


@contextmanager
def _no_store(_: Path) -> Iterator[Session]:
    yield Session(lambda run_dir: [])


def _alone(make: Callable[[Path], Any]) -> Callable[[Path], AbstractContextManager[Session]]:
    """One capability per run, `make(run_dir)`, with nothing living beside the runs."""

    @contextmanager
    def setup(_: Path) -> Iterator[Session]:
        yield Session(lambda run_dir: [make(run_dir)])

    return setup


def _harness(make_store: Callable[[Path], Any]) -> Callable[[Path], AbstractContextManager[Session]]:
    return _alone(lambda run_dir: StepPersistence(store=make_store(run_dir)))


def _with_recorder(capabilities: Callable[[str, Path], list[Any]]) -> Callable[[Path], AbstractContextManager[Session]]:
    """A recorder process for all runs at one N, and `capabilities(endpoint, folder)` for each run; after each
    run, wait until the recorder applied it to DuckDB (its applier works behind the acknowledgements and would
    otherwise share the CPU with the next run)."""

    @contextmanager
    def setup(folder: Path) -> Iterator[Session]:
        recorder = RecorderProcess(folder / "recorder-data").start()
        try:
            yield Session(
                lambda run_dir: capabilities(recorder.endpoint, folder), settle=lambda: settle(recorder.endpoint)
            )
        finally:
            shutdown_pipelines()
            recorder.stop(timeout=60)

    return setup


def _steprec(**options: Any) -> Callable[[Path], AbstractContextManager[Session]]:
    return _with_recorder(
        lambda endpoint, folder: [StepRecorder(endpoint=endpoint, journal_dir=folder / "journal", **options)]
    )


@dataclass
class BareAcknowledgements(AbstractCapability[Any]):
    """Not a recorder: at the two points per step where steprec's `acknowledged` mode waits for the recorder
    (before a tool runs, after its `CallToolsNode`), one empty OTLP Export answered by a real recorder,
    called straight from the event loop with no encoding, thread or journal. What the rule 'acknowledged
    before the hook returns' costs before any record is built: a floor for the `acknowledged` mode."""

    endpoint: str

    def __post_init__(self) -> None:
        self._export = grpc.insecure_channel(self.endpoint).unary_unary(EXPORT_METHOD)

    async def before_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any) -> Any:
        self._export(EMPTY_EXPORT)
        return args

    async def after_node_run(self, ctx: Any, *, node: Any, result: Any) -> Any:
        if isinstance(node, CallToolsNode):
            self._export(EMPTY_EXPORT)
        return result


_MESSAGE = TypeAdapter(ModelMessage)


def _new_messages_json(ctx: Any, result: Any, serialised: int) -> bytes:
    """pydantic-ai JSON of the messages from `serialised` on, and of the tool-return request pydantic-ai has not yet
    appended: what a recorder must serialise at a settled `CallToolsNode` for its resume point to hold the tool's
    return (pydantic-ai stamps that request when it appends it, so the next step serialises it again)."""
    texts = [_MESSAGE.dump_json(message) for message in ctx.messages[serialised:]]
    if isinstance(result, ModelRequestNode):
        texts.append(_MESSAGE.dump_json(result.request))
    return b"".join(texts)


@dataclass
class SerializeAndWrite(AbstractCapability[Any]):
    """Not a recorder: the work issue 18's own rule requires of any recorder before its hooks return, and
    nothing else. At each settled `CallToolsNode`, every message not serialised before is serialised once as
    pydantic-ai JSON, with the tool-return request folded in ahead of the graph (a process killed right after
    the tool returned must leave a resume point holding it; pydantic-ai stamps that request when it appends
    it, so the next step serialises it again), and written with one `write()`; before each tool, one
    `write()` of its call id. No records, digests, thread, event or recorder: a floor for the `journal` mode."""

    path: Path
    _fd: int = -1
    _serialised: int = 0

    async def for_run(self, ctx: Any) -> SerializeAndWrite:
        return SerializeAndWrite(self.path, os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))

    async def after_run(self, ctx: Any, *, result: Any) -> Any:
        os.close(self._fd)
        return result

    async def before_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any) -> Any:
        os.write(self._fd, call.tool_call_id.encode())
        return args

    async def after_node_run(self, ctx: Any, *, node: Any, result: Any) -> Any:
        if isinstance(node, CallToolsNode):
            os.write(self._fd, _new_messages_json(ctx, result, self._serialised))
            self._serialised = len(ctx.messages)
        return result


@dataclass
class SerializeAndAcknowledge(BareAcknowledgements):
    """Not a recorder: the floor of the `acknowledged` mode's rule. At each point where that mode waits, what
    `two-bare-acks` does, and at each settled `CallToolsNode` first the serialisation of `serialize-and-write`.
    The Export stays empty: a recorder that also validates and logs the bytes it acknowledges can only take longer,
    and an encoder that builds records from them can only add to the agent's time."""

    _serialised: int = 0

    async def after_node_run(self, ctx: Any, *, node: Any, result: Any) -> Any:
        if isinstance(node, CallToolsNode):
            _new_messages_json(ctx, result, self._serialised)
            self._serialised = len(ctx.messages)
        return await super().after_node_run(ctx, node=node, result=result)


VARIANTS = [
    Variant("none", _no_store),
    Variant("harness-memory", _harness(lambda d: InMemoryStepStore())),
    Variant("harness-sqlite", _harness(lambda d: SqliteStepStore(database=d / "steps.sqlite")), on_disk=True),
    Variant(
        "harness-file",
        _harness(lambda d: FileStepStore(d / "steps")),
        on_disk=True,
        skip_reason="FileStepStore re-reads every earlier snapshot file of the run on each save (O(N^3) bytes "
        "parsed per run)",
    ),
    Variant(STEPREC, _steprec()),
    Variant(ACKNOWLEDGED, _steprec(delivery="acknowledged")),
    Variant("steprec-best-effort", _steprec(delivery="best_effort")),
    Variant(FLOOR, _with_recorder(lambda endpoint, folder: [BareAcknowledgements(endpoint)])),
    Variant(WORK_FLOOR, _alone(lambda run_dir: SerializeAndWrite(run_dir / "floor.bin"))),
    Variant(ACK_FLOOR, _with_recorder(lambda endpoint, folder: [SerializeAndAcknowledge(endpoint)])),
]


def _message_bytes(result: Any) -> int:
    """Bytes of pydantic-ai JSON of the run's distinct messages (what any store has to keep at least once)."""
    return sum(map(len, {ModelMessagesTypeAdapter.dump_json([m])[1:-1] for m in result.all_messages()}))


def _keep(run_dir: Path, database: str, folder: Path) -> Path:
    """Move a SQLite database (with its WAL) out of a run's folder, for the reads measurement to go on from."""
    folder.mkdir()
    for path in run_dir.glob(f"{database}*"):
        path.rename(folder / path.name)
    return folder / database


async def _timings(variants: list[Variant], steps: int, plan: tuple[int, dict[str, int]], folder: Path) -> dict:
    """Per variant, its run times at `steps` steps (round-robin in rotating order) and its bytes after each run."""
    repeats, fewer = plan
    tool_returns = payloads(steps)
    seconds: dict[str, list[float]] = {v.name: [] for v in variants}
    stored: dict[str, int] = {}
    facts: dict[str, Any] = {"seconds": seconds, "bytes": stored}
    with ExitStack() as stack:
        setups = {v.name: stack.enter_context(v.setup(folder / v.name)) for v in variants}
        on_disk = {v.name for v in variants if v.on_disk}

        async def run_once(name: str, returns: list[str]) -> tuple[float, Any]:
            run_dir = Path(tempfile.mkdtemp(dir=folder))
            try:
                built = agent(returns, setups[name].capabilities(run_dir))
                await asyncio.sleep(SETTLE_SECONDS)
                elapsed, result = await timed_run(built)
                await setups[name].settle()
                if name in on_disk and len(returns) == steps and name not in stored:
                    stored[name] = folder_bytes(run_dir)
                    if name == "harness-sqlite":
                        facts["harness_database"] = _keep(run_dir, "steps.sqlite", folder / "kept-harness")
                        facts["harness_seconds"] = elapsed
                return elapsed, result
            finally:
                shutil.rmtree(run_dir)

        for name in setups:
            await run_once(name, tool_returns[:WARMUP_STEPS])
        names = list(setups)
        for repeat in range(repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in (n for n in order if repeat < fewer.get(n, repeats)):
                elapsed, result = await run_once(name, tool_returns)
                seconds[name].append(elapsed)
                if name == "none" and repeat == 0:
                    facts["message_bytes"] = _message_bytes(result)
            medians = ", ".join(f"{n} {statistics.median(t) * 1000:,.0f} ms" for n, t in seconds.items() if t)
            progress("overhead", f"N={steps}: repeat {repeat + 1}/{repeats} done; medians so far: {medians}")
    return facts


async def _steprec_storage(steps: int, folder: Path) -> tuple[dict[str, int], float]:
    """A fresh recorder's bytes after one run, the recorder stopped: its whole data folder, and DuckDB plus media."""
    data = folder / "recorder-data"
    with RecorderProcess(data) as recorder:
        built = agent(payloads(steps), [StepRecorder(endpoint=recorder.endpoint, journal_dir=folder / "journal")])
        elapsed, _ = await timed_run(built)
        shutdown_pipelines()
    media = data / "media"
    database = (data / DATABASE_NAME).stat().st_size + (folder_bytes(media) if media.exists() else 0)
    return {STEPREC: folder_bytes(data), "steprec-database": database}, elapsed


def _skip_text(variant: Variant, steps: int, measured: dict[int, float]) -> str:
    """Why a variant is not run at `steps`, with a power-law estimate of one run from the two largest N measured."""
    text = variant.skip_reason or "one run takes too long for this suite"
    if len(measured) >= 2:
        (n1, t1), (n2, t2) = sorted(measured.items())[-2:]
        exponent = math.log(t2 / t1) / math.log(n2 / n1)
        estimate = t2 * (steps / n2) ** exponent
        text += f"; its medians ({t1:.1f} s at N={n1}, {t2:.1f} s at N={n2}) put one run at ~{estimate / 60:.0f} min"
    return text


async def _measure(quick: bool, workspace: Workspace) -> dict[str, Any]:
    plans = QUICK if quick else FULL
    sizes = []
    medians: dict[str, dict[int, float]] = {v.name: {} for v in VARIANTS}
    for steps, (repeats, fewer) in plans.items():
        folder = workspace.folder / f"overhead-{steps}"
        run = [v for v in VARIANTS if fewer.get(v.name, repeats) > 0]
        skipped = {v.name: _skip_text(v, steps, medians[v.name]) for v in VARIANTS if v not in run}
        progress("overhead", f"N={steps}: one {STEPREC} run with a fresh recorder for its size on disk")
        steprec_bytes, steprec_seconds = await _steprec_storage(steps, folder / "storage")
        facts = await _timings(run, steps, (repeats, fewer), folder)
        for name, times in facts["seconds"].items():
            medians[name][steps] = statistics.median(times)
        if "harness_database" in facts:
            workspace.long_runs[steps] = LongRun(
                steps, facts["harness_database"], facts["harness_seconds"], folder / "storage" / "recorder-data",
                steprec_seconds,
            )  # fmt: skip
        sizes.append(
            {
                "steps": steps,
                "seconds": facts["seconds"],
                "skipped": skipped,
                "bytes": facts["bytes"] | steprec_bytes,
                "message_bytes": facts["message_bytes"],
            }
        )
    return {"tool_return_chars": TOOL_RETURN_CHARS, "sizes": sizes}


# -- figures and tables ----------------------------------------------------------------------------


def figures(size: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per variant at one N: total seconds, and added ms/step and ratio against `none` paired by repeat."""
    steps, base = size["steps"], size["seconds"]["none"]
    out = {}
    for name, runs in size["seconds"].items():
        pairs = list(zip(runs, base, strict=False))
        out[name] = {
            "total": Spread.of(runs),
            "added": Spread.of((t - b) * 1000 / steps for t, b in pairs),
            "ratio": Spread.of(t / b for t, b in pairs),
        }
    return out


def overhead_table(data: dict[str, Any]) -> str:
    lines = [
        "| variant | N | runs | total ms, median (min-max) | added ms/step vs none, median (min-max) | ratio to none |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for size in data["sizes"]:
        for name, found in figures(size).items():
            lines.append(
                f"| {name} | {size['steps']} | {found['total'].count} | {found['total'].text(0, 1000)} "
                f"| {found['added'].text(2, signed=True)} | {found['ratio'].text(2, unit='x')} |"
            )
        notes += [f"- `{name}` not run at N={size['steps']}: {why}." for name, why in size["skipped"].items()]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def storage_table(data: dict[str, Any]) -> str:
    stores = ["harness-sqlite", "harness-file", STEPREC, "steprec-database"]
    labels = {
        "harness-sqlite": "harness SqliteStepStore (file, WAL included)",
        "harness-file": "harness FileStepStore (its folder)",
        STEPREC: "steprec recorder, whole data folder (DuckDB, write-ahead log, media, log file)",
        "steprec-database": "... of which the DuckDB file plus media",
        "messages": "distinct message bytes (pydantic-ai JSON)",
    }
    sizes = data["sizes"]
    lines = [
        "| store | " + " | ".join(f"N={s['steps']}" for s in sizes) + " | bytes/step at the largest N |",
        "|---|" + "---:|" * (len(sizes) + 1),
    ]
    for store in [*stores, "messages"]:
        values = [s["message_bytes"] if store == "messages" else s["bytes"].get(store) for s in sizes]
        cells = [f"{v:,}" if v is not None else "not run" for v in values]
        last = next(((v, s["steps"]) for v, s in zip(values[::-1], sizes[::-1], strict=True) if v is not None), None)
        per_step = f"{last[0] / last[1]:,.0f} (N={last[1]})" if last else ""
        lines.append(f"| {labels[store]} | " + " | ".join(cells) + f" | {per_step} |")
    return "\n".join(lines) + "\n"


def _slopes(data: dict[str, Any], store: str) -> list[tuple[int, int, float]]:
    """Bytes per added step between consecutive N: (from N, to N, bytes/step), for the N the store has bytes at."""
    points = [
        (s["steps"], s["message_bytes"] if store == "messages" else s["bytes"][store])
        for s in data["sizes"]
        if store == "messages" or store in s["bytes"]
    ]
    return [(n1, n2, (b2 - b1) / (n2 - n1)) for (n1, b1), (n2, b2) in zip(points, points[1:], strict=False)]


def _slope_text(slopes: list[tuple[int, int, float]]) -> str:
    return ", ".join(f"{slope:,.0f} (N={n1}->{n2})" for n1, n2, slope in slopes)


def _floor_text(found: dict[str, Spread] | None, what: str, figure: str, **style: Any) -> str:
    if found is None:
        return ""
    return f"; {what}: {found[figure].text(2, **style)}"


def targets(data: dict[str, Any]) -> list[Target]:
    by_n = {size["steps"]: size for size in data["sizes"]}
    timed = {steps: figures(size).get(STEPREC) for steps, size in by_n.items()}
    floor = {steps: figures(size).get(FLOOR) for steps, size in by_n.items()}
    work = {steps: figures(size).get(WORK_FLOOR) for steps, size in by_n.items()}
    work_alone = f"the rule's own work alone (`{WORK_FLOOR}`)"
    at_200, at_1000 = timed.get(200), timed.get(1000)
    acknowledged_200 = figures(by_n[200]).get(ACKNOWLEDGED) if 200 in by_n else None
    stored = by_n.get(STORAGE_TARGET_N, {}).get("bytes", {})
    labels = ((STEPREC, "steprec"), ("harness-sqlite", "harness Sqlite"), ("messages", "distinct messages"))
    slopes = {store: _slopes(data, store) for store, _ in labels}
    steprec = [slope for _, _, slope in slopes[STEPREC]]
    linear = steprec[-1] <= LINEAR_SLOPE_GROWTH * steprec[0] if len(steprec) >= 2 else None  # needs three N
    return [
        Target(
            18,
            "steprec (`journal`, the default) adds at most 10% to the no-capability time at N=200",
            f"{at_200['ratio'].text(2, unit='x')} over {at_200['ratio'].count} paired repeats"
            + _floor_text(work.get(200), work_alone, "ratio", unit="x")
            if at_200
            else "not run",
            at_200["ratio"].median <= 1.10 if at_200 else None,
        ),
        Target(
            18,
            "steprec (`journal`, the default) adds at most 0.5 ms per step at N=1000",
            f"{at_1000['added'].text(2, unit=' ms/step', signed=True)} over {at_1000['added'].count} paired repeats"
            + _floor_text(work.get(1000), work_alone, "added", unit=" ms/step", signed=True)
            if at_1000
            else "N=1000 not run (`--quick`)",
            at_1000["added"].median <= 0.5 if at_1000 else None,
        ),
        Target(
            18,
            "`acknowledged` adds at most 0.5 ms per step more than `two-bare-acks` at N=200",
            f"{acknowledged_200['added'].text(2, unit=' ms/step', signed=True)}"
            + _floor_text(
                floor.get(200),
                f"two bare acknowledgements per step alone (`{FLOOR}`)",
                "added",
                unit=" ms/step",
                signed=True,
            )
            + _floor_text(
                figures(by_n[200]).get(ACK_FLOOR),
                f"those plus the serialisation the rule needs (`{ACK_FLOOR}`)",
                "added",
                unit=" ms/step",
                signed=True,
            )
            if acknowledged_200 and floor.get(200)
            else "not run",
            acknowledged_200["added"].median - floor[200]["added"].median <= 0.5
            if acknowledged_200 and floor.get(200)
            else None,
        ),
        Target(
            4,
            f"after a {STORAGE_TARGET_N}-step run with 2 KB tool returns, the DuckDB file plus media at most 1.5 MB",
            f"{stored['steprec-database']:,} bytes ({stored[STEPREC]:,} for the whole data folder)" if stored else "",
            stored["steprec-database"] <= STORAGE_TARGET_BYTES if stored else None,
        ),
        Target(
            7,
            "steprec's bytes on disk grow linearly with N (the bytes an added step costs do not grow with N)",
            "bytes per added step: " + "; ".join(f"{label} {_slope_text(slopes[store])}" for store, label in labels),
            linear,
        ),
    ]


def main(quick: bool, workspace: Workspace) -> Outcome:
    data = asyncio.run(_measure(quick, workspace))
    found = targets(data)
    sections = {"overhead": overhead_table(data), "storage": storage_table(data)}
    markdown = "\n".join(
        [
            f"# Agent overhead and storage{' (quick)' if quick else ''}",
            "",
            __doc__.split("\n", 2)[2],
            "## Time",
            "",
            "Added ms/step and ratio are medians over the repeats of the differences and ratios against `none` in "
            "the same repeat.",
            "",
            sections["overhead"],
            "## Bytes on disk after one run",
            "",
            sections["storage"],
            "## Targets",
            "",
            targets_table(found),
        ]
    )
    print(markdown, flush=True)
    return Outcome(data=data, targets=found, markdown=markdown, sections=sections)
