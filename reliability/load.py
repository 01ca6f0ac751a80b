"""Load and slowness (issue 6): a slow recorder behind a delaying proxy, and a soak of several processes.

Everything is a real OS process on 127.0.0.1: the recorder (`RecorderProcess`),
each pydantic-ai agent (this module run as `python -m reliability.load agent`,
driven phase by phase over its stdin and stdout), and the load generator
(`python -m reliability.load loadgen`). Only the delaying proxy lives in the
calling process, on its own thread, so a scenario can change the delay between
phases while the agent's connection stays open.

- `slow_recorder`: one agent records through `DelayingProxy` while the delay
  steps through values below and above the exporter's `timeout_seconds`. Each
  phase reports the wall time of every step; the bound is what
  `OrderedDeliveryProcessor` promises (see `step_bound`). The agent's peak RSS
  is read at several sizes of a journaling phase, and at the end every record must
  be stored exactly once.
- `soak`: several agent processes and a load generator against one recorder for
  a fixed time; records/s, Export latency, recorder RSS over time and what each
  part of its memory budget held (its Prometheus gauges), sent = stored.

`main(quick)` runs both and returns the markdown section of the reliability report.

The agent processes import this module too, so it imports only the standard
library at the top: the recorder's and the query client's packages (DuckDB,
pyarrow) are imported where they are used, keeping the agent's RSS its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Generic, TypeVar

ROOT = Path(__file__).resolve().parent.parent

BARRIERS_PER_STEP = 2
"""Acknowledgement waits in each timed interval of a run (`_AgentChild.timed_run`). A tool step waits
for `tool_call_started` (before the tool runs) and for its snapshot (after the tool cycle); the run's
start waits for registration; its end for the final snapshot and `run_completed` (docs/delivery.md)."""

MARGIN_SECONDS = 2.0
"""Scheduling slack added to every latency bound: the test machine has two shared cores."""

EXPORT_METHOD = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


def step_bound(timeout_seconds: float) -> float:
    """The longest one timed interval may take when the recorder is slow, by `OrderedDeliveryProcessor`'s design.

    A barrier waits for the request carrying its records: at most `timeout_seconds`
    before the request fails and goes to the journal. If the delivery thread was busy
    with a journal re-send attempt when the barrier came, that attempt can take another
    `timeout_seconds` first. Hence two timeouts per barrier.
    """
    return BARRIERS_PER_STEP * 2 * timeout_seconds + MARGIN_SECONDS


def default_timeout_seconds() -> float:
    """`StepRecorder.timeout_seconds` as shipped: read from the dataclass, so the report follows the code."""
    from steprec.exporter import StepRecorder

    (timeout,) = (f.default for f in fields(StepRecorder) if f.name == "timeout_seconds")
    return float(timeout)


# -- the delaying proxy -------------------------------------------------------------------------


class DelayingProxy:
    """A TCP proxy to the recorder that holds back every chunk the recorder sends by `delay` seconds.

    The answer path is delayed, not the request path: the recorder commits each
    request at once and its acknowledgement arrives `delay` later, which is the
    case that matters most. When `delay` exceeds the exporter's timeout the
    exporter gives up on a request the recorder did store, journals it and sends
    it again, so replay suppression is exercised on every such request. HTTP/2
    flow-control and ping frames are delayed too, like on a slow link.

    Each chunk is released `delay` after it arrived, in arrival order (added
    latency, not a bandwidth cap). `delay` may change at any time; it applies to
    chunks that arrive afterwards. The proxy runs an event loop on its own thread.
    """

    def __init__(self, upstream: str, delay: float = 0.0) -> None:
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self.delay = delay
        self.endpoint = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="delaying-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def start(self) -> DelayingProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", 0), self._loop
        ).result(timeout=10)
        self.endpoint = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> DelayingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            client_writer.close()
            self._connections.discard(task)
            return
        try:
            await asyncio.gather(
                self._pipe(client_reader, upstream_writer, lambda: 0.0),
                self._pipe(upstream_reader, client_writer, lambda: self.delay),
            )
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            for writer in (client_writer, upstream_writer):
                writer.close()
            self._connections.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay) -> None:
        """Copy `reader` to `writer`, each chunk released `delay()` seconds after it arrived."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def release() -> None:
            while (item := await queue.get()) is not None:
                due, chunk = item
                await asyncio.sleep(max(due - loop.time(), 0))
                writer.write(chunk)
                await writer.drain()
            writer.close()

        releaser = asyncio.create_task(release())
        try:
            while chunk := await reader.read(1 << 16):
                queue.put_nowait((loop.time() + delay(), chunk))
        except ConnectionError:
            pass
        finally:
            queue.put_nowait(None)
            with contextlib.suppress(ConnectionError):
                await releaser


# -- memory of a process ------------------------------------------------------------------------


def status_kib(pid: int, key: str) -> int:
    """A `kB` line of /proc/<pid>/status: `VmRSS` (now) or `VmHWM` (peak since the process started)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(f"{key} not in /proc/{pid}/status")


T = TypeVar("T")


class Sampler(Generic[T]):
    """Calls `read` once per `interval` on a thread: `(seconds since start, value)` pairs.

    A reading that fails (the process is gone, its metrics port does not answer) is skipped.
    """

    def __init__(self, read: Callable[[], T], interval: float) -> None:
        self._read = read
        self._interval = interval
        self._stop = threading.Event()
        self.samples: list[tuple[float, T]] = []
        self._thread = threading.Thread(target=self._sample, name="sampler", daemon=True)

    def _sample(self) -> None:
        started = time.monotonic()
        while True:
            with contextlib.suppress(OSError, KeyError):
                self.samples.append((time.monotonic() - started, self._read()))
            if self._stop.wait(self._interval):
                return

    def __enter__(self) -> Sampler[T]:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# -- agent processes ----------------------------------------------------------------------------


COUNTED_VIEWS = ("runs", "events", "snapshots", "effect_records")
"""The views `stored_by_agent` counts, named as in `reliability.faults.expected_records`."""


def records_per_run(steps: int) -> dict[str, int]:
    """Rows one `echo_agent` run of `steps` tool calls adds to each of `COUNTED_VIEWS`.

    The fault matrix's `expected_records` (by view and kind) summed over kinds,
    so both scenario modules hold the same one statement of what a run records.
    """
    from reliability.faults import expected_records

    per_view = dict.fromkeys(COUNTED_VIEWS, 0)
    for (view, _), rows in expected_records(steps).items():
        if view in per_view:
            per_view[view] += rows
    return per_view


@dataclass
class PhaseReport:
    """What an agent process did in one phase: wall seconds of each timed interval, runs, failures."""

    intervals: list[float]
    runs: int
    steps: int
    errors: list[str]
    seconds: float


class AgentProcess:
    """An `echo_agent` with a StepRecorder in its own OS process, told what to run one phase at a time.

    One process lives through all phases, so its pipeline, journal and connection
    carry over from phase to phase as they would in a long-lived agent, and its
    VmHWM covers the whole run. Its stderr (the exporter's warnings, one per
    journaled request) goes to `<agent_name>.log` beside the journal folder.
    """

    def __init__(self, endpoint: str, agent_name: str, journal_dir: Path, **recorder_options: Any) -> None:
        config = {"endpoint": endpoint, "agent_name": agent_name, **recorder_options}
        env = {**os.environ, "STEPREC_JOURNAL_DIR": str(journal_dir)}
        command = [sys.executable, "-m", "reliability.load", "agent", json.dumps(config)]
        self.agent_name = agent_name
        self.log_path = journal_dir.parent / f"{agent_name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
            )

    def start_phase(
        self, steps: int, *, runs: int = 0, seconds: float = 0.0, tool_delay: float = 0.0, padding: int = 0
    ) -> None:
        """Begin `runs` runs of `steps` tool calls each (or as many as fit in `seconds`); does not wait.

        `tool_delay` and `padding` are `echo_agent`'s: seconds of pretend work, characters added to each return.
        """
        assert self.process.stdin is not None
        command = {"steps": steps, "runs": runs, "seconds": seconds, "tool_delay": tool_delay, "padding": padding}
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def finish_phase(self) -> PhaseReport:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            code, log = self.process.wait(), self.log_path.read_text()[-2000:]
            raise RuntimeError(f"agent process {self.agent_name} exited with {code}:\n{log}")
        return PhaseReport(**json.loads(line))

    def phase(self, steps: int, **options: Any) -> PhaseReport:
        self.start_phase(steps, **options)
        return self.finish_phase()

    def peak_rss_kib(self) -> int:
        return status_kib(self.process.pid, "VmHWM")

    def end_input(self) -> None:
        """No more phases: the process exits the ordinary way, its exit flush delivering or journaling the rest."""
        assert self.process.stdin is not None
        if not self.process.stdin.closed:
            self.process.stdin.close()

    def close(self, timeout: float = 60.0) -> int:
        """`end_input`, then wait for the exit; the exit code."""
        self.end_input()
        try:
            return self.process.wait(timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class _AgentChild:
    """The agent process's side of `AgentProcess`: one JSON command per stdin line, one report per stdout line."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self._agents: dict[tuple[int, float, int], Any] = {}

    def agent(self, steps: int, tool_delay: float, padding: int):
        from tests.agents import echo_agent

        key = (steps, tool_delay, padding)
        if key not in self._agents:
            self._agents[key] = echo_agent(calls=steps, delay=tool_delay, padding=padding, **self.config)
        return self._agents[key]

    @staticmethod
    async def timed_run(agent) -> list[float]:
        """Run once; wall seconds from start to the first model request, between model requests, then to the end.

        Each interval holds at most `BARRIERS_PER_STEP` acknowledgement waits.
        """
        from pydantic_ai import ModelRequestNode

        intervals, last = [], time.perf_counter()
        async with agent.iter("go") as run:
            async for node in run:
                if isinstance(node, ModelRequestNode):
                    now = time.perf_counter()
                    intervals.append(now - last)
                    last = now
        intervals.append(time.perf_counter() - last)
        return intervals

    async def phase(self, steps: int, runs: int, seconds: float, tool_delay: float, padding: int) -> PhaseReport:
        agent = self.agent(steps, tool_delay, padding)
        started = time.perf_counter()
        deadline = started + seconds
        report = PhaseReport(intervals=[], runs=0, steps=0, errors=[], seconds=0.0)
        while (runs and report.runs < runs) or (seconds and time.perf_counter() < deadline):
            try:
                report.intervals += await self.timed_run(agent)
            except Exception as error:  # reported, and the test fails on it
                report.errors.append(f"{type(error).__name__}: {error}")
            report.runs += 1
            report.steps += steps
        report.seconds = time.perf_counter() - started
        return report

    def serve(self) -> None:
        from steprec.exporter import shutdown_pipelines

        for line in sys.stdin:
            report = asyncio.run(self.phase(**json.loads(line)))
            print(json.dumps(report.__dict__), flush=True)
        shutdown_pipelines()


# -- the load generator -------------------------------------------------------------------------


@dataclass
class LoadReport:
    """What the load generator sent: every request's Export latency, and how far it fell behind its rate."""

    requests: int
    records: int
    seconds: float
    latencies: list[float]
    failures: list[str]
    late_requests: int


def generate_load(
    endpoint: str, rate: float, records_per_request: int, requests_per_run: int, seconds: float
) -> LoadReport:
    """Send `benchmarks.load` step-event requests at `rate` records/s for `seconds`, one at a time.

    Requests go out on a fixed schedule; a request that is due while the previous
    one is still waiting for its answer goes out as soon as that is answered and
    counts as late, without a catch-up burst, so the rate stays steady. Every
    `requests_per_run` requests the events move to a new run (`load-0`, `load-1`,
    ...), as many agents' runs would: one endless run would measure how the
    recorder holds a single run's replay keys, not whether it holds steady.
    """
    import grpc

    from benchmarks.load import step_events_request

    interval = records_per_request / rate
    channel = grpc.insecure_channel(endpoint)
    export = channel.unary_unary(EXPORT_METHOD)
    report = LoadReport(0, 0, 0.0, [], [], 0)
    started = due = time.perf_counter()
    while due < started + seconds:
        if (wait := due - time.perf_counter()) > 0:
            time.sleep(wait)
        elif wait < -interval:
            report.late_requests += 1
            due = time.perf_counter()
        run = report.requests // requests_per_run
        payload = step_events_request(f"load-{run}", report.requests, records_per_request).SerializeToString()
        sent = time.perf_counter()
        try:
            export(payload, timeout=30)
        except grpc.RpcError as error:
            report.failures.append(f"request {report.requests}: {error.code().name}")
        report.latencies.append(time.perf_counter() - sent)
        report.requests += 1
        report.records += records_per_request
        due += interval
    report.seconds = time.perf_counter() - started
    channel.close()
    return report


def _spawn_load(**arguments: Any) -> subprocess.Popen[str]:
    """`generate_load(**arguments)` in its own process; its `LoadReport` comes back as one JSON line."""
    command = [sys.executable, "-m", "reliability.load", "loadgen", json.dumps(arguments)]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)


# -- counting what the recorder stored ----------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """Rows the recorder holds for one source, and how many of them are distinct records (by key)."""

    counts: dict[str, int]
    distinct: dict[str, int]

    @property
    def duplicates(self) -> int:
        return sum(self.counts.values()) - sum(self.distinct.values())


def _sql(endpoint: str, query: str) -> dict[str, int]:
    from steprec.query import RecorderClient

    async def read() -> dict[str, int]:
        async with RecorderClient(endpoint, timeout_seconds=120) as client:
            return (await client.sql(query, timeout_seconds=120)).to_pylist()[0]

    return asyncio.run(read())


_RECORD_KEYS = {
    "runs": ("runs", "run_id"),
    "events": ("events", "run_id, idempotency_key"),
    "snapshots": ("snapshots", "run_id, snapshot_index"),
    "effect_records": ("tool_effect_records", "run_id, tool_call_id, status"),
}
"""Per counted view: the view the rows are in, and the columns that name one record."""


COUNT_SLICES = 16
"""The distinct count goes in this many slices of run ids (by hash), so each query's hash table holds a
sixteenth of the keys: distinct over the soak's 3.6 million load events at once ran out of a 64 MiB
DuckDB pool (it spills to `<file>.tmp`, but not far enough for that)."""


def _rows_and_records(endpoint: str, view: str, key: str, where: str) -> tuple[int, int]:
    """Rows of `view` matching `where`, and distinct records among them by `key` (whose first column is
    `run_id`: a record never spans two slices)."""
    rows = records = 0
    for part in range(COUNT_SLICES):
        row = _sql(  # one scan: the rows are the groups' sizes added up, the records the groups
            endpoint,
            f"SELECT coalesce(sum(copies), 0)::BIGINT AS n, count(*) AS d FROM (SELECT count(*) AS copies FROM {view}"
            f" WHERE {where} AND hash(run_id) % {COUNT_SLICES} = {part} GROUP BY {key})",
        )
        rows, records = rows + row["n"], records + row["d"]
    return rows, records


def stored_by_agent(endpoint: str, agent_name: str) -> Stored:
    """Runs, events, snapshots and tool-effect records of `agent_name`, each also counted by record key."""
    where = f"run_id IN (SELECT run_id FROM runs WHERE agent_name = '{agent_name}')"
    counted = {name: _rows_and_records(endpoint, view, key, where) for name, (view, key) in _RECORD_KEYS.items()}
    return Stored({k: counted[k][0] for k in COUNTED_VIEWS}, {k: counted[k][1] for k in COUNTED_VIEWS})


def stored_load(endpoint: str) -> Stored:
    """The load generator's events (runs `load-<n>`), also counted by record key."""
    rows, records = _rows_and_records(endpoint, "events", _RECORD_KEYS["events"][1], "run_id LIKE 'load-%'")
    return Stored({"events": rows}, {"events": records})


# -- figures ------------------------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


@dataclass(frozen=True)
class Latency:
    p50: float
    p99: float
    max: float
    count: int

    @classmethod
    def of(cls, values: list[float]) -> Latency:
        return cls(percentile(values, 0.5), percentile(values, 0.99), max(values, default=0.0), len(values))


def _scale(counts: dict[str, int], runs: int) -> dict[str, int]:
    return {kind: n * runs for kind, n in counts.items()}


def _add(*counts: dict[str, int]) -> dict[str, int]:
    total: dict[str, int] = {}
    for each in counts:
        for kind, n in each.items():
            total[kind] = total.get(kind, 0) + n
    return total


# -- scenario 1: a slow recorder ----------------------------------------------------------------


@dataclass(frozen=True)
class SlowPhase:
    """One phase of `slow_recorder`: the proxy's delay, and the wall time of every timed interval."""

    name: str
    delay: float
    runs: int
    steps: int
    seconds: float
    latency: Latency
    baseline_p50: float
    bound: float
    errors: tuple[str, ...]

    @property
    def added_p50(self) -> float:
        return self.latency.p50 - self.baseline_p50

    @property
    def within_bound(self) -> bool:
        return self.latency.max <= self.bound


@dataclass(frozen=True)
class SlowRecorderResult:
    timeout_seconds: float
    phases: tuple[SlowPhase, ...]
    memory: tuple[MemoryPoint, ...]
    """After each leg of the journaling phase."""
    expected: dict[str, int]
    stored: Stored
    journal_left_bytes: int
    exit_code: int
    exit_seconds: float
    journaled_after_recovery: Backlog
    """Still in the journal when `recovering` ended: nothing when the journal drained while the agent ran."""

    @property
    def journaled_before_recovery(self) -> Backlog:
        return self.memory[-1].journaled

    def phase(self, name: str) -> SlowPhase:
        (found,) = (p for p in self.phases if p.name == name)
        return found

    @property
    def lost(self) -> int:
        return sum(self.expected.values()) - sum(self.stored.distinct.values())


@dataclass(frozen=True)
class Backlog:
    """What waits in an agent's journal folder, read from outside the process."""

    requests: int
    bytes: int


def journal_backlog(journal: Path) -> Backlog:
    """Frames past each segment's `.pos` mark (docs/delivery.md), and their bytes."""
    from steprec.proto.framing import read_frames

    requests = size = 0
    for segment in journal.glob("journal-*.log"):
        mark = segment.with_suffix(".pos")
        position = int(mark.read_text() or 0) if mark.exists() else 0
        ends = [end for _, end, _ in read_frames(segment) if end > position]
        requests += len(ends)
        size += ends[-1] - position if ends else 0
    return Backlog(requests, size)


@dataclass(frozen=True)
class MemoryPoint:
    """The agent's peak RSS and its journal's backlog after `steps` steps of the journaling phase."""

    steps: int
    peak_rss_kib: int
    journaled: Backlog


def drain_backoff_cap() -> float:
    """The longest pause between two re-send attempts of the journal (`_delivery._RETRY_BACKOFF`)."""
    from steprec.exporter._delivery import _RETRY_BACKOFF

    return _RETRY_BACKOFF[1]


def slow_recorder(
    folder: Path,
    *,
    timeout_seconds: float,
    delays: tuple[float, ...] = (0.05, 0.5),
    runs: int = 2,
    steps: int = 5,
    memory_steps: tuple[int, ...] = (200, 800),
    journal_padding: int = 0,
    recovery_delay: float = 0.05,
) -> SlowRecorderResult:
    """One agent process records through a `DelayingProxy`; the delay changes phase by phase.

    The agent records with `delivery="acknowledged"`, the mode whose hooks wait for the
    recorder's answer, so the delay reaches its steps; with the default journal they wait
    for a local write only and a slow recorder shows in the journal's backlog, not in steps.

    Phases: `baseline` (no delay), one per entry of `delays`; `journaling` (delay
    1.5 x `timeout_seconds`, so every request times out and is journaled) until
    `memory_steps[-1]` steps, the agent's VmHWM and journal backlog read at each of
    `memory_steps` (runs of 10 steps, so a growing history does not pass for a
    leak; `journal_padding` characters on each tool return, so the journal outgrows
    any allowance for noise in RSS); then `recovering`
    (`recovery_delay`, below the timeout) for longer than the journal's longest
    re-send pause, so the journal drains while the agent keeps running. Then the
    delay drops to zero and the agent process exits normally; its exit flush
    delivers what is left. Every record it sent must then be stored exactly once.
    """
    from steprec.recorder.daemon.process import RecorderProcess

    name = "slow-recorder"
    journal = folder / "journal"
    phases: list[SlowPhase] = []
    expected: dict[str, int] = {}
    with RecorderProcess(folder / "recorder") as recorder, DelayingProxy(recorder.endpoint) as proxy:
        agent = AgentProcess(proxy.endpoint, name, journal, delivery="acknowledged", timeout_seconds=timeout_seconds)
        try:

            def phase(label: str, delay: float, steps: int, legs: list[dict[str, Any]]) -> list[MemoryPoint]:
                """Run `legs` (`AgentProcess.phase` options each) at `delay`; memory after each leg."""
                nonlocal expected
                proxy.delay = delay
                reports, points = [], []
                for leg in legs:
                    reports.append(agent.phase(steps, **leg))
                    done = sum(r.steps for r in reports)
                    points.append(MemoryPoint(done, agent.peak_rss_kib(), journal_backlog(journal)))
                done = sum(r.runs for r in reports)
                expected = _add(expected, _scale(records_per_run(steps), done))
                latency = Latency.of([i for r in reports for i in r.intervals])
                baseline = phases[0].latency.p50 if phases else latency.p50
                phases.append(
                    SlowPhase(
                        label,
                        delay,
                        done,
                        done * steps,
                        sum(r.seconds for r in reports),
                        latency,
                        baseline,
                        step_bound(timeout_seconds),
                        tuple(e for r in reports for e in r.errors),
                    )
                )
                _progress(f"slow recorder: {label}: p50 {_ms(latency.p50)} ms, max {_ms(latency.max)} ms")
                return points

            phase("baseline", 0.0, steps, [{"runs": runs}])
            for delay in delays:
                phase(f"{_ms(delay)} ms", delay, steps, [{"runs": runs}])
            run_steps = 10
            legs = [
                {"runs": (b - a) // run_steps, "padding": journal_padding}
                for a, b in itertools.pairwise((0, *memory_steps))
            ]
            memory = phase("journaling", 1.5 * timeout_seconds, run_steps, legs)
            phase("recovering", recovery_delay, steps, [{"seconds": drain_backoff_cap() + 2 * timeout_seconds}])
            still_journaled = journal_backlog(journal)
            proxy.delay = 0.0
            exit_started = time.perf_counter()
            exit_code = agent.close()
            exit_seconds = time.perf_counter() - exit_started
        finally:
            agent.kill()
        journal_left = sum(p.stat().st_size for p in journal.glob("journal-*.log"))
        stored = stored_by_agent(recorder.endpoint, name)
    return SlowRecorderResult(
        timeout_seconds=timeout_seconds,
        phases=tuple(phases),
        memory=tuple(memory),
        expected=expected,
        stored=stored,
        journal_left_bytes=journal_left,
        exit_code=exit_code,
        exit_seconds=exit_seconds,
        journaled_after_recovery=still_journaled,
    )


# -- scenario 2: the soak -----------------------------------------------------------------------


@dataclass(frozen=True)
class SoakResult:
    seconds: float
    agents: int
    steps: int
    tool_delay: float
    agent_runs: int
    agent_errors: tuple[str, ...]
    load_rate: float
    load: LoadReport
    export_latency: Latency
    recorder_mean_ingest_seconds: float
    """Recorder-side time per Export (steprec_ingest_seconds_total / steprec_export_requests_total)."""
    rss_samples: tuple[tuple[float, int], ...]
    gauge_samples: tuple[tuple[float, dict[str, float]], ...]
    """The recorder's unlabelled metrics, scraped every `GAUGE_SAMPLE_SECONDS`: its memory gauges among them."""
    duckdb_memory_mib: int
    """The recorder's `--duckdb-memory-mib`: DuckDB's share of its memory budget."""
    message_cache_mib: int
    run_state_mib: int
    database_bytes: int
    """Size of the DuckDB file and its own log at the end: context for the RSS figures."""
    expected: dict[str, int]
    stored: dict[str, int]
    stored_distinct: dict[str, int]

    @property
    def records_per_second(self) -> float:
        """Log records stored per second; run rows are left out, they come from `run_started` events."""
        records = sum(n for view, n in self.stored_distinct.items() if view != "runs")
        return records / self.seconds

    @property
    def lost(self) -> int:
        return sum(self.expected.values()) - sum(self.stored_distinct.values())

    @property
    def duplicates(self) -> int:
        return sum(self.stored.values()) - sum(self.stored_distinct.values())

    def rss_by_window(self, windows: int = 10, statistic: Callable[[list[float]], float] = max) -> list[int]:
        """Max (or another `statistic`) of VmRSS (KiB) in each of `windows` equal stretches of the run:
        where memory levels off. The max shows passing peaks too, the median the level between them."""
        return [int(statistic(values)) if values else 0 for values in self._by_window(self.rss_samples, windows)]

    def gauge_by_window(self, name: str, windows: int = 10) -> list[float | None]:
        """Max of one memory gauge in each of `windows` equal stretches of the run (those of `rss_by_window`);
        None where no scrape fell."""
        samples = [(t, gauges[name]) for t, gauges in self.gauge_samples if name in gauges]
        return [max(values) if values else None for values in self._by_window(samples, windows)]

    def _by_window(self, samples, windows: int) -> list[list[float]]:
        end = self.rss_samples[-1][0] or 1.0
        values: list[list[float]] = [[] for _ in range(windows)]
        for t, value in samples:
            values[min(int(t / end * windows), windows - 1)].append(value)
        return values

    def second_half_growth(self) -> float:
        """How much the level of RSS rose over the second half: the median of the last tenth over the
        median of the sixth, less one (issue 19 asks under 5%)."""
        medians = self.rss_by_window(statistic=statistics.median)
        return medians[-1] / medians[5] - 1 if medians[5] else float("nan")

    def stated_budget_mib(self) -> float:
        """What docs/storage.md says a recorder with this soak's flags needs at most, before passing peaks."""
        return STATED_FIXED_MIB + self.duckdb_memory_mib + self.message_cache_mib + self.run_state_mib

    def rss_window_max(self, first: bool) -> int:
        """Max VmRSS (KiB) in the first or the last window: a minute, or a third of a shorter run."""
        window = min(60.0, self.seconds / 3)
        end = self.rss_samples[-1][0]
        picked = [kib for t, kib in self.rss_samples if (t <= window if first else t >= end - window)]
        return max(picked)


def soak(
    folder: Path,
    *,
    seconds: float,
    agents: int = 3,
    steps: int = 5,
    tool_delay: float = 0.01,
    load_rate: float = 2000.0,
    records_per_request: int = 100,
    requests_per_run: int = 50,
    duckdb_memory_mib: int = 64,
    message_cache_mib: int = 32,
    run_state_mib: int = 64,
) -> SoakResult:
    """`agents` agent processes and one load generator against one recorder for `seconds`.

    Agents run back to back runs of `steps` tool calls, each call pausing
    `tool_delay` (pretend work, which paces them); the load generator sends
    `load_rate` records/s. The recorder's VmRSS is sampled every second, its memory gauges every
    `GAUGE_SAMPLE_SECONDS`. Its memory budget (DuckDB, message cache, run state) is set small
    enough for each part to fill within the run's first half, so the samples show where its memory levels
    off: DuckDB's pool keeps the pages its checkpoints write, about 6.5 MiB a minute here, so 128 MiB filled
    only after 20-22 minutes; 64 was at its bound from the second tenth. Afterwards every record each process
    sent is counted in the recorder.
    """
    from steprec.recorder.daemon.process import RecorderProcess

    names = [f"soak-agent-{i}" for i in range(agents)]
    options = (
        "--metrics-listen", "127.0.0.1:0", "--duckdb-memory-mib", str(duckdb_memory_mib),
        "--message-cache-mib", str(message_cache_mib), "--run-state-mib", str(run_state_mib),
    )  # fmt: skip
    with RecorderProcess(folder / "recorder", extra_args=options) as recorder:
        processes = [AgentProcess(recorder.endpoint, n, folder / f"journal-{n}") for n in names]
        try:
            # Imports take a second or two: let every agent be ready before the clock starts.
            for process in processes:
                process.phase(1, runs=1)
            assert recorder.process is not None
            pid, url = recorder.process.pid, recorder.metrics_url
            with (
                Sampler(lambda: status_kib(pid, "VmRSS"), 1.0) as sampler,
                Sampler(lambda: _scrape(url), GAUGE_SAMPLE_SECONDS) as gauges,
            ):
                load = _spawn_load(
                    endpoint=recorder.endpoint,
                    rate=load_rate,
                    records_per_request=records_per_request,
                    requests_per_run=requests_per_run,
                    seconds=seconds,
                )
                for process in processes:
                    process.start_phase(steps, seconds=seconds, tool_delay=tool_delay)
                reports = [process.finish_phase() for process in processes]
                out, _ = load.communicate(timeout=seconds + 120)
            load_report = LoadReport(**json.loads(out))
            for process in processes:
                process.end_input()  # all exit at once
            for process in processes:
                process.close()
        finally:
            for process in processes:
                process.kill()
        metrics = _scrape(recorder.metrics_url)
        stored = [stored_by_agent(recorder.endpoint, n) for n in names]
        load_stored = stored_load(recorder.endpoint)
    expected = _add(
        *(_scale(records_per_run(steps), r.runs) for r in reports),
        _scale(records_per_run(1), agents),  # the warm-up run of each agent
        {"load_events": load_report.records},
    )
    counted = _add(*(s.counts for s in stored), {"load_events": load_stored.counts["events"]})
    distinct = _add(*(s.distinct for s in stored), {"load_events": load_stored.distinct["events"]})
    requests = metrics.get("steprec_export_requests_total", 0.0)
    return SoakResult(
        duckdb_memory_mib=duckdb_memory_mib,
        message_cache_mib=message_cache_mib,
        run_state_mib=run_state_mib,
        seconds=max(load_report.seconds, *(r.seconds for r in reports)),
        agents=agents,
        steps=steps,
        tool_delay=tool_delay,
        agent_runs=sum(r.runs for r in reports),
        agent_errors=tuple(e for r in reports for e in r.errors),
        load_rate=load_rate,
        load=load_report,
        export_latency=Latency.of(load_report.latencies),
        recorder_mean_ingest_seconds=metrics.get("steprec_ingest_seconds_total", 0.0) / requests if requests else 0.0,
        rss_samples=tuple(sampler.samples),
        gauge_samples=tuple(gauges.samples),
        database_bytes=int(metrics.get("steprec_database_bytes", 0)),
        expected=expected,
        stored=counted,
        stored_distinct=distinct,
    )


def _scrape(url: str) -> dict[str, float]:
    """Unlabelled samples of the recorder's Prometheus text (empty when it has no metrics port)."""
    import urllib.request

    if not url:
        return {}
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split()
            samples[name] = float(value)
    return samples


# -- the report ---------------------------------------------------------------------------------


def _progress(message: str) -> None:
    print(f"[load] {message}", file=sys.stderr, flush=True)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}"


def _mib(kib: int) -> str:
    return f"{kib / 1024:,.1f}"


def slow_recorder_section(result: SlowRecorderResult) -> list[str]:
    lines = [
        f"Exporter `timeout_seconds` = {result.timeout_seconds:g} s; bound per timed interval = "
        f"{BARRIERS_PER_STEP} barriers x 2 x timeout + {MARGIN_SECONDS:g} s slack = "
        f"{step_bound(result.timeout_seconds):g} s.",
        "",
        "| phase | delay ms | runs | steps | p50 ms | p99 ms | max ms | added p50 ms | within bound | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for p in result.phases:
        lines.append(
            f"| {p.name} | {_ms(p.delay)} | {p.runs} | {p.steps} | {p.latency.p50 * 1000:,.1f} | "
            f"{_ms(p.latency.p99)} | {_ms(p.latency.max)} | {p.added_p50 * 1000:,.1f} | "
            f"{'yes' if p.within_bound else '**NO**'} | {len(p.errors)} |"
        )
    before, after = result.journaled_before_recovery, result.journaled_after_recovery
    lines += [
        "",
        "| journaling: steps so far | agent peak RSS (VmHWM) MiB | journaled requests | journaled MiB |",
        "|---:|---:|---:|---:|",
        *(
            f"| {p.steps:,} | {_mib(p.peak_rss_kib)} | {p.journaled.requests:,} | {_mib(p.journaled.bytes // 1024)} |"
            for p in result.memory
        ),
        "",
        f"- `recovering` began with {before.requests:,} requests ({_mib(before.bytes // 1024)} MiB) in the agent's "
        f"journal and ended with {after.requests:,}",
        f"- afterwards (delay 0, agent exit flush {result.exit_seconds:,.1f} s, exit code {result.exit_code}): "
        f"expected {_counts(result.expected)}; stored {_counts(result.stored.counts)}; "
        f"lost {result.lost}, duplicates {result.stored.duplicates}, journal left {result.journal_left_bytes} bytes",
    ]
    return lines


def soak_section(result: SoakResult) -> list[str]:
    samples = result.rss_samples
    window = min(60.0, result.seconds / 3)
    return [
        f"{result.agents} agent processes (back-to-back runs of {result.steps} tool calls, each "
        f"{_ms(result.tool_delay)} ms of pretend work; {result.agent_runs:,} runs, {len(result.agent_errors)} errors) "
        f"and one load generator ({result.load_rate:,.0f} records/s in requests of "
        f"{result.load.records // max(result.load.requests, 1)} step events; {result.load.late_requests} late, "
        f"{len(result.load.failures)} failed) against one recorder for {result.seconds:,.0f} s.",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| log records stored per second (all processes) | {result.records_per_second:,.0f} |",
        f"| load generator Export latency p50 / p99 / max ms | {result.export_latency.p50 * 1000:,.1f} / "
        f"{result.export_latency.p99 * 1000:,.1f} / {_ms(result.export_latency.max)} |",
        f"| recorder time per Export, mean ms (Prometheus) | {result.recorder_mean_ingest_seconds * 1000:,.2f} |",
        f"| recorder's memory budget: `--duckdb-memory-mib` / `--message-cache-mib` / `--run-state-mib` | "
        f"{result.duckdb_memory_mib} / {result.message_cache_mib} / {result.run_state_mib} |",
        f"| recorder RSS max, first {window:,.0f} s / last {window:,.0f} s MiB | "
        f"{_mib(result.rss_window_max(True))} / {_mib(result.rss_window_max(False))} |",
        f"| recorder RSS min / max over the run MiB ({len(samples)} samples) | "
        f"{_mib(min(k for _, k in samples))} / {_mib(max(k for _, k in samples))} |",
        f"| recorder RSS median growth over the second half (last tenth over sixth; limit 5%) | "
        f"{result.second_half_growth():+.1%} |",
        f"| recorder RSS max over the run / the budget docs/storage.md states for these flags MiB | "
        f"{_mib(max(k for _, k in samples))} / {result.stated_budget_mib():,.0f} |",
        f"| recorder RSS max in each tenth of the run MiB | {' / '.join(_mib(k) for k in result.rss_by_window())} |",
        f"| recorder RSS median in each tenth of the run MiB | "
        f"{' / '.join(_mib(k) for k in result.rss_by_window(statistic=statistics.median))} |",
        *(
            f"| {label} max in each tenth MiB | "
            f"{' / '.join('-' if b is None else _mib(int(b) // 1024) for b in result.gauge_by_window(gauge))} |"
            for label, gauge in SOAK_GAUGES.items()
        ),
        f"| DuckDB file at the end MiB | {result.database_bytes / (1 << 20):,.1f} |",
        f"| sent | {_counts(result.expected)} |",
        f"| stored | {_counts(result.stored)} |",
        f"| lost / duplicates | {result.lost} / {result.duplicates} |",
    ]


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n:,}" for kind, n in counts.items())


QUICK_SLOW: dict[str, Any] = {
    "timeout_seconds": 0.5,
    "delays": (0.05, 0.25),
    "runs": 1,
    "steps": 3,
    "memory_steps": (20, 80),
    "journal_padding": 300_000,
    "recovery_delay": 0.03,
}
"""`slow_recorder` at the sizes of the normal test suite (tests/test_load_faults.py) and of `--quick`.

A configured timeout of half a second makes "slower than the timeout" fit in a
test. The padding makes the 60 steps between the memory readings journal about
18 MB, far more than RSS noise. With the recovery delay, re-sending the journal one request at a time takes
(journaled requests x delay), above `step_bound` by itself: a drain that held a
hook for all of it would break the bound however fast the machine is."""
GAUGE_SAMPLE_SECONDS = 2.0
SOAK_GAUGES = {
    "DuckDB memory (`steprec_duckdb_memory_bytes`)": "steprec_duckdb_memory_bytes",
    "message cache (`steprec_message_cache_bytes`)": "steprec_message_cache_bytes",
    "run state (`steprec_run_state_bytes`)": "steprec_run_state_bytes",
    "write-ahead log on disk (`steprec_wal_bytes`)": "steprec_wal_bytes",
}
"""The parts of the recorder's memory budget the soak reports tenth by tenth, and its log on disk."""
STATED_FIXED_MIB = 225 + 32 + 5 + 55 + 4
"""The parts of docs/storage.md's memory budget no flag sets: code and libraries (225), snapshots read lately
(32), snapshot choices (5), digests known stored (55), the two Bloom filters at their least (4)."""
QUICK_SOAK_SECONDS = 8.0
SOAK_SECONDS = 1800.0
"""Long enough for the recorder's memory budget to fill and show where RSS levels off: the soak's
32 MiB message cache and 64 MiB of run state are full after about 170 s (its own gauges, in a
420 s run); DuckDB's 128 MiB fill more slowly, as reads touch more of the growing file's pages
(45 MiB after 420 s). (At 64 MiB the final counting queries ran out of DuckDB memory.)"""


def slow_options(quick: bool) -> dict[str, Any]:
    """`slow_recorder`'s sizes: `QUICK_SLOW`, or the report's, at the exporter's shipped timeout."""
    if quick:
        return QUICK_SLOW
    return {
        "timeout_seconds": default_timeout_seconds(),
        "delays": (0.05, 0.5),
        "runs": 3,
        "steps": 5,
        "memory_steps": (200, 800, 1600, 3200),
        "journal_padding": 16_000,  # about 35 KB journaled per step: 3,200 steps stay well inside the 256 MiB bound
        "recovery_delay": 0.0,
    }


def main(quick: bool = False) -> str:
    """Run the slow-recorder scenario and return its markdown section (the soak is reliability/soak.py)."""
    with tempfile.TemporaryDirectory() as folder:
        slow = slow_recorder(Path(folder) / "slow", **slow_options(quick))
    lines = [
        "## Slow recorder",
        "",
        "One agent process records through a TCP proxy that delays every chunk the recorder sends "
        "(`DelayingProxy` in `reliability/load.py`): each acknowledgement arrives that much later, after the "
        "recorder stored the request. Latency is the wall time of each interval of a run (start to first model "
        "request, model request to model request, last one to the end), each holding at most "
        f"{BARRIERS_PER_STEP} acknowledgement waits. `journaling`: the delay exceeds the timeout, every request "
        "times out, is journaled and sent again later (runs of 10 steps). `recovering`: the delay is back below "
        "the timeout, for longer than the journal's longest re-send pause, so the journal drains while the agent runs.",
        "",
        *slow_recorder_section(slow),
    ]
    report = "\n".join(lines) + "\n"
    print(report, flush=True)
    return report


def _child(role: str, arguments: str) -> None:
    """Entry of the agent and load-generator processes (see `AgentProcess` and `_spawn_load`)."""
    config = json.loads(arguments)
    if role == "agent":
        _AgentChild(config).serve()
    elif role == "loadgen":
        print(json.dumps(generate_load(**config).__dict__), flush=True)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    _child(*sys.argv[1:3])
