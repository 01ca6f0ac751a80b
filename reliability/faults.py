"""The fault matrix (issue 6): agents and recorders killed with real signals, a recorder down, a journal full.

Everything is a real OS process on 127.0.0.1: the recorder (`RecorderProcess`, killed with
SIGKILL and restarted on the same port and data folder) and every agent
(`python -m tests.crash_agent MODE ...`, see that module for the biller and its kill points).
Nothing is mocked. The recorder's view afterwards is read through `RecorderClient` and its SQL
views, which see every acknowledged record.

- `agent_kills`: the biller SIGKILLed at each recorded boundary in turn; the recorder must hold
  exactly what the step-persistence semantics promise (`PROMISES`), and a new process resumes
  from it and ends with the history an uninterrupted run ends with.
- `recorder_kills`: the recorder SIGKILLed and restarted again and again while several agent
  processes run many steps; every record stored exactly once.
- `recorder_outage`: the recorder down for a long stretch while agents run; they finish, the
  journal drains when it returns, nothing is lost.
- `journal_overflow`: the recorder unreachable and the journal bound exceeded; exactly the requests
  that cannot fit are dropped, each counted and warned about, and the rest are delivered later.

Each returns a `FaultResult`; tests/test_faults.py runs each at a fast size, `main(quick)` at
report size and returns the markdown section of the reliability report.
"""

from __future__ import annotations

import asyncio
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from pydantic_ai.messages import ModelMessage
from steprec.proto import wire
from steprec.proto.framing import read_frames
from steprec.proto.journal import SEGMENT_GLOB
from steprec.proto.journal import status as journal_status
from steprec.query import RecorderClient
from steprec.recorder.daemon.process import RecorderProcess

from tests.crash_agent import KILL_POINTS, Started, report, start

AGENT_TIMEOUT = 180.0
"""Seconds an agent process may take after it was told to finish; far beyond any healthy run."""


@dataclass
class FaultResult:
    """What one scenario did and found. `problems` lists every broken promise; empty means it held."""

    scenario: str
    faults: int = 0
    """Faults injected: processes SIGKILLed, outages, requests that could not fit the journal."""
    expected: int = 0
    """Records the agents' behaviour says the recorder must hold (or, for a kill, was promised)."""
    stored: int = 0
    """Rows of those records the recorder holds, duplicates included."""
    duplicates: int = 0
    lost: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    """Scenario-specific figures, for the report."""

    def tally(self, what: str, expected: int, stored: int, distinct: int) -> None:
        """Add one kind of record: `stored` rows holding `distinct` records by key, `expected` of them wanted."""
        self.expected += expected
        self.stored += stored
        self.duplicates += stored - distinct
        self.lost += max(expected - distinct, 0)
        if stored != expected or distinct != expected:
            self.problems.append(f"{what}: expected {expected}, stored {stored} rows of {distinct} distinct records")


@contextmanager
def _workspace(name: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"steprec-{name}-") as folder:
        yield Path(folder)


def _progress(message: str) -> None:
    print(f"[faults] {message}", file=sys.stderr, flush=True)


async def _finish(agent: Started, timeout: float = AGENT_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(agent.finish, timeout)


# -- 1. the agent killed at every recorded boundary --------------------------------------------


@dataclass(frozen=True)
class Promise:
    """What the recorder must hold after the biller is killed at one point, and how it is resumed.

    In terms of the biller's uninterrupted run (tests/crash_agent.py), whose trail is 16 events:
    `run_started`; for each of c0, c1, c2 `model_request_started`, `model_request_completed`,
    `tool_call_started`, `tool_call_completed`; the final request's pair; `run_completed`. And 12
    snapshots (it records with `capture_frontier`): for each model request the accepted request
    (complete), the response (interrupted while it proposes a call) and the settled cycle with the
    returns folded in (complete), the final response being saved twice (frontier and settled).
    """

    events: int
    """The first `events` of that trail were acknowledged before the kill: all stored, exactly once."""
    snapshots: int
    """The first `snapshots` of those snapshots, the same in state, step and messages; no other."""
    unsent: int = 0
    """Events after those that were emitted without waiting (docs/delivery.md); each may be lost."""
    unresolved: tuple[str, ...] = ()
    """Tool calls with a `started` effect and no end: their side effect may or may not have happened."""
    resume: str = "continue"
    """The crash-agent mode that picks the run up in a new process."""
    resumed_calls: tuple[str, ...] = ()
    """The tool calls that new process executes (a pending call of an interrupted snapshot runs again)."""


UNINTERRUPTED = (16, 12)
"""Events and snapshots of the biller's uninterrupted run (see `Promise`)."""

PROMISES = {
    # Registration is awaited in before_run: the run exists, nothing else. No snapshot to continue
    # from (continue_run raises LookupError), so the conversation starts over.
    "after_run_start": Promise(events=1, snapshots=0, resume="restart", resumed_calls=("c0", "c1", "c2")),
    # c0's settled snapshot and the second request's frontier were awaited; model_request_started
    # was only queued. The newest snapshot is complete and holds c0's return.
    "before_model_request": Promise(events=5, snapshots=4, unsent=1, resumed_calls=("c1", "c2")),
    # The frontier holding the response that proposes c1 was awaited (and with it the request's two
    # events): newest snapshot interrupted, nothing unresolved, so c1 can safely run on resume.
    "after_model_request": Promise(events=7, snapshots=5, resume="continue_interrupted", resumed_calls=("c1", "c2")),
    # `started` and `tool_call_started` are awaited before the tool runs: c1 is unresolved.
    "inside_tool": Promise(
        events=8, snapshots=5, unresolved=("c1",), resume="continue_interrupted", resumed_calls=("c1", "c2")
    ),
    # The tool finished, but its end was not recorded yet: the same view as inside it. The charge
    # happened; only the ledger's "may or may not have happened" says so, and resuming repeats it.
    "after_tool_body": Promise(
        events=8, snapshots=5, unresolved=("c1",), resume="continue_interrupted", resumed_calls=("c1", "c2")
    ),
    # The settled cycle with c1's return folded in was awaited: a complete resume point (#373).
    "after_tool_return": Promise(events=9, snapshots=6, resumed_calls=("c2",)),
    # The final answer is in a complete snapshot; only run_completed is missing. Resuming needs no
    # model request and no tool call: the new run just ends with that answer.
    "during_after_run": Promise(events=15, snapshots=12),
}
assert PROMISES.keys() == KILL_POINTS.keys(), "every kill point has a promise"


def _shape(messages: list[ModelMessage]) -> list[tuple]:
    """A history without timestamps and ids that differ between runs: who said what, which calls and returns."""
    return [
        (
            message.kind,
            [(p.part_kind, getattr(p, "tool_call_id", None), str(getattr(p, "content", p))) for p in message.parts],
        )
        for message in messages
    ]


@dataclass
class _Trail:
    """One run as the recorder holds it, in comparable form."""

    outcome: str
    events: list[tuple[str, str | None, int]]
    event_keys: list[str | None]
    snapshots: list[tuple[int, str, int, list[tuple]]]
    effects: dict[str, str]
    unresolved: list[str]

    @classmethod
    async def read(cls, client: RecorderClient, run_id: str) -> _Trail:
        run = await client.get_run(run_id)
        events = await client.list_events(run_id)
        snapshots = []
        for summary in await client.list_snapshots(run_id, include_interrupted=True):
            snapshot = await client.get_snapshot(run_id, summary.snapshot_index)
            assert snapshot is not None
            snapshots.append((snapshot.snapshot_index, snapshot.state, snapshot.step_index, _shape(snapshot.messages)))
        return cls(
            outcome=run.outcome if run else "missing",
            events=[(e.kind, e.tool_call_id, e.step_index) for e in events],
            event_keys=[e.idempotency_key for e in events],
            snapshots=snapshots,
            effects={e.tool_call_id: e.status for e in await client.list_tool_effects(run_id)},
            unresolved=[e.tool_call_id for e in await client.list_unresolved_tool_effects(run_id)],
        )


async def _check_crashed(
    client: RecorderClient, point: str, run_id: str, reference: _Trail, result: FaultResult
) -> None:
    """The recorder's view of a run killed at `point`, against its promise and the uninterrupted reference."""
    promise, problems = PROMISES[point], result.problems
    trail = await _Trail.read(client, run_id)
    if trail.outcome != "running":
        problems.append(f"{point}: outcome {trail.outcome!r}, but a killed run never said how it ended")
    acknowledged = reference.events[: promise.events]
    allowed = [reference.events[: promise.events + extra] for extra in range(promise.unsent + 1)]
    if trail.events not in allowed:
        problems.append(
            f"{point}: events end {trail.events[-3:]}, promised {acknowledged[-3:]} (+{promise.unsent} unsent)"
        )
    # Idempotency keys are per-run counters, the same in every run of the biller: the reference's are the promised ones.
    promised_keys = set(reference.event_keys[: promise.events])
    rows = [key for key in trail.event_keys if key in promised_keys]
    result.tally(f"{point}: acknowledged events", len(promised_keys), len(rows), len(set(rows)))
    unsent_arrived = len(trail.events) - len(rows)
    result.notes["unsent events that arrived"] = result.notes.get("unsent events that arrived", 0) + unsent_arrived
    promised = reference.snapshots[: promise.snapshots]
    if trail.snapshots != promised:
        problems.append(f"{point}: snapshots {[s[:3] for s in trail.snapshots]}, promised {[s[:3] for s in promised]}")
    result.tally(f"{point}: snapshots", len(promised), len(trail.snapshots), len({s[0] for s in trail.snapshots}))
    # The ledger follows the acknowledged tool events: started for every tool_call_started, ended for every end.
    started = [call for kind, call, _ in acknowledged if kind == "tool_call_started"]
    ended = {call for kind, call, _ in acknowledged if kind == "tool_call_completed"}
    ledger = {call: "completed" if call in ended else "started" for call in started}
    if trail.effects != ledger or trail.unresolved != list(promise.unresolved):
        problems.append(
            f"{point}: effects {trail.effects}, unresolved {trail.unresolved}; promised {ledger}, {promise.unresolved}"
        )
    # What the default and the include_interrupted read paths (continue_run) pick.
    for include_interrupted in (False, True):
        candidates = [s for s in promised if include_interrupted or s[1] == "complete"]
        latest = await client.latest_snapshot(run_id, include_interrupted=include_interrupted)
        got = (latest.snapshot_index, latest.state) if latest else None
        want = candidates[-1][:2] if candidates else None
        if got != want:
            problems.append(
                f"{point}: latest_snapshot(include_interrupted={include_interrupted}) is {got}, promised {want}"
            )


async def _check_resumed(
    client: RecorderClient, point: str, done: subprocess.CompletedProcess[str], reference: _Trail, result: FaultResult
) -> None:
    """The run a new process made from the crashed one: finished, ran only what was left, ends like the reference."""
    promise = PROMISES[point]
    try:
        line = report(done)
    except RuntimeError as error:
        result.problems.append(f"{point}: resuming with {promise.resume!r} failed: {error}")
        return
    trail = await _Trail.read(client, line["run_id"])
    calls = {call: "completed" for call in promise.resumed_calls}
    if line["output"] != "charged 3 times" or trail.outcome != "completed" or trail.effects != calls:
        result.problems.append(
            f"{point}: resumed run said {line['output']!r}, ended {trail.outcome}, ran {trail.effects}"
        )
    if [kind for kind, _, _ in trail.events[:: len(trail.events) - 1]] != ["run_started", "run_completed"]:
        result.problems.append(f"{point}: the resumed run's trail runs from {trail.events[0]} to {trail.events[-1]}")
    if not trail.snapshots or trail.snapshots[-1][3] != reference.snapshots[-1][3]:
        result.problems.append(f"{point}: the resumed run does not end with the uninterrupted run's history")


async def _all_finished(agents: dict[str, Started]) -> dict[str, subprocess.CompletedProcess[str]]:
    """Wait for agent processes started together; any still running on the way out is killed."""
    try:
        return {name: await _finish(agent) for name, agent in agents.items()}
    finally:
        for agent in agents.values():
            agent.kill()


ADOPTION_SECONDS = 10.0
"""How long the recorder may take here to deliver the journals of every agent of a round. The promise is
2 s with nothing else running (tests/test_journal_delivery.py); here seven agent processes start and die
at once on two cores, beside the recorder."""


async def _adopted(journal: Path, result: FaultResult) -> None:
    """Wait until the recorder delivered the dead agents' journals; a problem if it takes over `ADOPTION_SECONDS`."""
    started = time.monotonic()
    while list(journal.glob(SEGMENT_GLOB)):
        if time.monotonic() - started > ADOPTION_SECONDS:
            result.problems.append(
                f"the recorder did not adopt the dead agents' journals within {ADOPTION_SECONDS:g} s"
            )
            return
        await asyncio.sleep(0.05)
    took = round(time.monotonic() - started, 2)
    result.notes["longest_adoption_s"] = max(result.notes.get("longest_adoption_s", 0.0), took)


async def agent_kills(rounds: int = 1) -> FaultResult:
    """The biller SIGKILLed at every kill point, `rounds` times each, then resumed in new processes.

    Per round, one process per kill point starts, all together, against one recorder; once they
    died, one new process per killed run resumes it as its promise says. The run that starts over
    after `after_run_start` (the kill before any step) is an uninterrupted run of the biller: it is
    the reference the others are compared with.
    """
    result = FaultResult("agent SIGKILLed at each recorded boundary, then resumed in a new process")
    started = time.monotonic()
    with _workspace("agent-kills") as folder:
        journal = folder / "journal"
        journal.mkdir(mode=0o700)
        recorder = RecorderProcess(folder / "recorder", extra_args=("--adopt-journals", str(journal)))
        await _agent_kills(recorder, journal, rounds, result)
    result.seconds = time.monotonic() - started
    result.notes["kill points"] = len(KILL_POINTS)
    return result


async def _agent_kills(recorder: RecorderProcess, journal: Path, rounds: int, result: FaultResult) -> None:
    with recorder:
        endpoint = recorder.endpoint
        async with RecorderClient(endpoint) as client:
            for round_ in range(rounds):
                conversations = {point: f"kill-{round_}-{point}" for point in KILL_POINTS}
                killed = await _all_finished(
                    {p: start(p, endpoint, c, journal=journal) for p, c in conversations.items()}
                )
                await _adopted(journal, result)
                for point, exit_ in killed.items():
                    if exit_.returncode == -signal.SIGKILL:
                        result.faults += 1
                    else:
                        result.problems.append(f"{point}: the agent exited with {exit_.returncode}, not SIGKILL")
                        del conversations[point]
                resumed = await _all_finished(
                    {p: start(PROMISES[p].resume, endpoint, c, journal=journal) for p, c in conversations.items()}
                )
                runs = {p: await client.list_runs(conversation_id=c) for p, c in conversations.items()}
                if len(runs.get("after_run_start", [])) != 2:
                    result.problems.append("no uninterrupted run to compare with: starting over failed")
                    break
                reference = await _Trail.read(client, runs["after_run_start"][1].run_id)
                if (len(reference.events), len(reference.snapshots)) != UNINTERRUPTED:
                    result.problems.append(
                        f"the uninterrupted run left {len(reference.events)} events and "
                        f"{len(reference.snapshots)} snapshots, not {UNINTERRUPTED}"
                    )
                    break
                for point, found in runs.items():
                    if len(found) != 2:
                        result.problems.append(f"{point}: {len(found)} runs, not the killed one and its resumption")
                        continue
                    await _check_crashed(client, point, found[0].run_id, reference, result)
                    await _check_resumed(client, point, resumed[point], reference, result)
                _progress(f"agent kills: round {round_ + 1}/{rounds} done")


# -- 2 and 3. the recorder killed, or down for long, under running agents ----------------------


def expected_records(calls: int) -> Counter[tuple[str, str]]:
    """What one `echo_agent` run of `calls` tool calls records, by (view, kind or status).

    Events: the run's start and end, a model request pair for each of `calls + 1` requests, a tool
    call pair per call. Snapshots: one per settled tool cycle and one with the answer. Effect
    records: `started` and `completed` per call.
    """
    return Counter(
        {
            ("runs", "completed"): 1,
            ("events", "run_started"): 1,
            ("events", "run_completed"): 1,
            ("events", "model_request_started"): calls + 1,
            ("events", "model_request_completed"): calls + 1,
            ("events", "tool_call_started"): calls,
            ("events", "tool_call_completed"): calls,
            ("snapshots", ""): calls + 1,
            ("effect_records", "started"): calls,
            ("effect_records", "completed"): calls,
        }
    )


STORED_SQL = {
    "runs": "SELECT run_id, outcome AS kind, count(*) AS n, count(DISTINCT run_id) AS d FROM runs GROUP BY ALL",
    "events": "SELECT run_id, kind, count(*) AS n, count(DISTINCT idempotency_key) AS d FROM events GROUP BY ALL",
    "snapshots": "SELECT run_id, '' AS kind, count(*) AS n, count(DISTINCT snapshot_index) AS d FROM snapshots"
    " GROUP BY ALL",
    "effect_records": "SELECT run_id, status AS kind, count(*) AS n, count(DISTINCT tool_call_id) AS d"
    " FROM tool_effect_records GROUP BY ALL",
    "tool_effects": "SELECT run_id, status AS kind, count(*) AS n, count(DISTINCT tool_call_id) AS d FROM tool_effects"
    " GROUP BY ALL",
}
"""Rows the recorder holds per run, view and kind, and how many distinct records they are (by key).
`tool_effects` is the ledger (one row per call, its latest status), not a record kind of its own."""


async def _stored(client: RecorderClient) -> dict[str, dict[tuple[str, str], tuple[int, int]]]:
    stored: dict[str, dict[tuple[str, str], tuple[int, int]]] = {}
    for view, query in STORED_SQL.items():
        for row in (await client.sql(query, max_rows=1_000_000, timeout_seconds=120)).to_pylist():
            stored.setdefault(row["run_id"], {})[(view, row["kind"])] = (row["n"], row["d"])
    return stored


async def _check_agents(client: RecorderClient, lines: list[dict], result: FaultResult) -> None:
    """Every agent's run stored exactly once, record by record, and nothing stored beyond them."""
    stored = await _stored(client)
    for line in lines:
        calls = (line["messages"] - 2) // 2
        run = stored.pop(line["run_id"], {})
        if (ledger := run.pop(("tool_effects", "completed"), None)) != (calls, calls) or any(
            view == "tool_effects" for view, _ in run
        ):
            result.problems.append(f"run {line['run_id']}: the ledger is not {calls} completed calls: {ledger}, {run}")
        for key, count in expected_records(calls).items():
            result.tally(f"run {line['run_id']} {key}", count, *run.pop(key, (0, 0)))
        for key, (rows, _) in run.items():
            result.problems.append(f"run {line['run_id']}: {rows} unexpected {key} rows")
        longest = await client.latest_snapshot(line["run_id"])
        if longest is None or len(longest.messages) != line["messages"]:
            result.problems.append(
                f"run {line['run_id']}: latest snapshot is not the run's {line['messages']} messages"
            )
    if stored:
        result.problems.append(f"runs no agent made: {sorted(stored)}")


@dataclass(frozen=True)
class _Down:
    """One fault: `after` seconds after the recorder (re)started, SIGKILL it; restart it `down_for` seconds later."""

    after: float
    down_for: float


async def _agents_through(
    name: str, schedule: list[_Down], *, agents: int, delay: float, padding: int, result: FaultResult
) -> None:
    """Agent processes recording through every fault of `schedule`, then told to finish; then count.

    The agents run `echo_agent` until a stop file appears, so however long restarts take on a
    loaded machine, every fault lands mid-run; each reports how many steps it made. They are told
    to stop only once their journal drained after the last restart, so the drain is timed while they
    still record.
    """
    started = time.monotonic()
    lines: list[dict] = []
    with _workspace(name) as folder:
        data, stop = folder / "recorder", folder / "stop"
        journal = _JournalWatch(folder / "journal")
        recorders = [RecorderProcess(data).start()]
        endpoint = recorders[0].endpoint
        options = {"calls": 5, "delay": delay, "padding": padding, "until": str(stop)}
        running = [
            start("echo", endpoint, f"{name}-{i}", options, log=folder / f"agent-{i}.log", journal=journal.folder)
            for i in range(agents)
        ]
        watching = asyncio.create_task(journal.watch())
        try:
            async with RecorderClient(endpoint) as client:
                while len(await client.list_runs()) < agents:  # every agent registered: faults land mid-run
                    await asyncio.sleep(0.05)
            for fault in schedule:
                await asyncio.sleep(fault.after)
                if any(agent.process.poll() is not None for agent in running):
                    result.problems.append("an agent stopped before the faults were over")
                    break
                recorders[-1].kill()
                result.faults += 1
                await asyncio.sleep(fault.down_for)
                recorders.append(RecorderProcess(data, listen=endpoint).start())
            drained = await journal.drained(since=time.monotonic())
            stop.touch()
            for i, agent in enumerate(running):
                try:
                    lines.append(report(await _finish(agent)))
                except RuntimeError as error:
                    result.problems.append(f"agent {i}: {error}")
            if leftover := journal.bytes():
                result.problems.append(f"{leftover} bytes still journaled after every agent finished")
            async with RecorderClient(endpoint) as client:
                await _check_agents(client, lines, result)
                longest_step = await _longest_step(client)
        finally:
            watching.cancel()
            for agent in running:
                agent.kill()
            for recorder in recorders:
                recorder.kill()
    result.seconds = time.monotonic() - started
    result.notes.update(
        agents=agents,
        steps=sum((line["messages"] - 2) // 2 for line in lines),
        peak_journal_kib=round(journal.peak / 1024),
        drained_after_last_restart_s=round(drained, 2) if drained is not None else "never",
        longest_step_s=round(longest_step, 2),
    )


async def _longest_step(client: RecorderClient) -> float:
    """The longest time between two tool calls of one run, by the agents' own clocks (events carry the
    time they were emitted): how long a fault held an agent up."""
    query = (
        "SELECT max(gap) AS longest FROM (SELECT epoch(recorded_at) - epoch(lag(recorded_at) OVER"
        " (PARTITION BY run_id ORDER BY recorded_at)) AS gap FROM events WHERE kind = 'tool_call_started')"
    )
    return (await client.sql(query)).to_pylist()[0]["longest"] or 0.0


CAUGHT_UP_BYTES = 64 << 10
"""Unacknowledged bytes in the agents' journals that count as caught up: the few requests of steps
in flight, which agents that go on recording always have."""


class _JournalWatch:
    """The agents' journal folder, watched from outside: its unacknowledged bytes now, their peak,
    when they caught up (`steprec journal status` reads the same)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.peak = 0

    def bytes(self) -> int:
        return sum(segment.unsent_bytes for segment in journal_status(self.folder))

    async def watch(self) -> None:
        while True:
            self.peak = max(self.peak, self.bytes())
            await asyncio.sleep(0.05)

    async def drained(self, since: float, timeout: float = 60.0) -> float | None:
        """Seconds from `since` until the journals caught up (None if that takes longer than `timeout`)."""
        while time.monotonic() - since < timeout:
            if self.bytes() <= CAUGHT_UP_BYTES:
                return time.monotonic() - since
            await asyncio.sleep(0.05)
        return None


async def recorder_kills(
    kills: int = 4, *, agents: int = 3, every: tuple[float, float] = (0.5, 1.0), delay: float = 0.05, seed: int = 6
) -> FaultResult:
    """The recorder SIGKILLed `kills` times, every `every` seconds (uniform, seeded), each time restarted
    at once on the same port and data folder, while `agents` processes record steps of `delay` seconds.

    Records answered just before a kill were in the write-ahead log but their answer may have been
    lost: the exporter journals and re-sends them, and the recorder must store them once.
    """
    result = FaultResult(f"recorder SIGKILLed every {every[0]}-{every[1]} s under {agents} agent processes")
    chance = random.Random(seed)
    schedule = [_Down(after=chance.uniform(*every), down_for=0.0) for _ in range(kills)]
    await _agents_through("recorder-kills", schedule, agents=agents, delay=delay, padding=2000, result=result)
    return result


async def recorder_outage(seconds: float = 30.0, *, agents: int = 3, delay: float = 0.05) -> FaultResult:
    """The recorder SIGKILLed and kept down for `seconds` while `agents` processes record, then restarted.

    The runs must not wait for it (records go to the journal), and once it is back the journal drains
    while they go on: at the end everything is stored once and the journal is empty.
    """
    result = FaultResult(f"recorder down for {seconds:g} s under {agents} agent processes")
    schedule = [_Down(after=0.5, down_for=seconds)]
    await _agents_through("recorder-outage", schedule, agents=agents, delay=delay, padding=2000, result=result)
    return result


# -- 3b. the journal filled past its bound ------------------------------------------------------


BIG_SHARE = 0.4
"""A tool return's share of the journal bound: every fit-or-drop decision is at least 0.2 of the bound
away from the edge, so the few hundred bytes of each small request never decide one."""


def must_drop(calls: int, bound: int, share: float = BIG_SHARE) -> tuple[int, int]:
    """How many snapshot-carrying requests a journal of `bound` bytes must drop when nothing drains,
    for `calls` tool cycles whose returns are each `share` of the bound, and how many were made.

    A request is dropped exactly when it does not fit beside those already held. A snapshot
    after a kept one is a delta: the first cycle's carries its return, every later cycle's two
    (the previous return again, stamped by pydantic-ai, and its own), the answer's one. A snapshot
    after a dropped one is sent whole, since the recorder refuses a delta on a base it never got:
    then cycle k's carries k returns and the answer's all of them. When the answer's was dropped,
    the run's end saves it once more, whole (`StepRecorder._confirm_last_snapshot`).
    """
    sizes: list[float] = []
    held = dropped = 0.0
    previous_dropped = False
    for cycle in range(1, calls + 3):
        answer = cycle >= calls + 1
        if cycle == calls + 2 and not previous_dropped:
            break  # the answer's snapshot was kept: nothing to save again
        whole = calls if answer else cycle
        delta = 1 if cycle == 1 or answer else 2
        sizes.append((whole if previous_dropped else delta) * share * bound)
        previous_dropped = held + sizes[-1] > bound
        if previous_dropped:
            dropped += 1
        else:
            held += sizes[-1]
    return int(dropped), len(sizes)


async def journal_overflow(calls: int = 10, *, bound: int = 1 << 20) -> FaultResult:
    """An agent records `calls` tool cycles to a recorder that is not there, with a journal of `bound` bytes.

    Every tool return is `BIG_SHARE` of the bound (and under the 1 MiB fragment size); `must_drop`
    is the exact number of requests dropped, each with a warning. Then a recorder comes up and a
    new process adopts and re-sends the journal: every event that was kept is stored, and the
    events missing are those of the dropped requests. (Of the snapshots kept, only those before
    the first drop are stored: the whole snapshot sent after a drop did not fit either.)
    """
    result = FaultResult(f"journal bound of {bound >> 10} KiB exceeded with the recorder down")
    started = time.monotonic()
    padding = int(bound * BIG_SHARE)
    expected_drops, snapshots_sent = must_drop(calls, bound)
    with _workspace("journal-overflow") as folder:
        journal = folder / "journal"
        endpoint = f"127.0.0.1:{_free_port()}"  # nothing listens there until the recorder starts on it
        options = {"calls": calls, "padding": padding, "journal_max_bytes": bound}
        done = await _finish(start("echo", endpoint, "overflow", options, log=folder / "agent.log", journal=journal))
        try:
            line = report(done)
        except RuntimeError as error:
            result.problems.append(f"the agent failed with the recorder down: {error}")
            return result
        warnings = sum("is full" in text for text in done.stderr.splitlines())
        result.faults = line["dropped"]
        if not line["dropped"] == warnings == expected_drops:
            result.problems.append(
                f"dropped {line['dropped']} requests with {warnings} warnings; exactly {expected_drops} do not fit"
            )
        kept = _journaled_records(journal)
        journaled_bytes = _JournalWatch(journal).bytes()
        if journaled_bytes > bound:
            result.problems.append(f"the journal holds {journaled_bytes} bytes, over its bound of {bound}")
        emitted = expected_records(calls)
        missing_snapshots = snapshots_sent - kept[("snapshots", "")]
        if missing_snapshots != expected_drops:  # each big request carries one snapshot, nothing else does
            result.problems.append(f"{missing_snapshots} snapshots missing from the journal, {expected_drops} dropped")
        with RecorderProcess(folder / "recorder", listen=endpoint) as recorder:
            drainer = await _finish(start("echo", endpoint, "drainer", {"calls": 1}, journal=journal))
            if drainer.returncode != 0:
                result.problems.append(f"the process re-sending the journal failed: {drainer.stderr[-2000:]}")
            if leftover := _JournalWatch(journal).bytes():
                result.problems.append(f"{leftover} bytes still journaled after a new process re-sent them")
            async with RecorderClient(recorder.endpoint) as client:
                stored = (await _stored(client)).get(line["run_id"], {})
        for kind in sorted(k for view, k in emitted if view == "events"):
            rows, distinct = stored.get(("events", kind), (0, 0))
            result.tally(f"kept {kind} events", kept[("events", kind)], rows, distinct)
    result.seconds = time.monotonic() - started
    result.notes.update(
        requests_dropped=line["dropped"],
        expected_drops=expected_drops,
        warnings=warnings,
        events_emitted=sum(n for (view, _), n in emitted.items() if view == "events"),
        snapshots_kept=kept[("snapshots", "")],
        snapshots_stored=stored.get(("snapshots", ""), (0, 0))[0],
    )
    return result


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _journaled_records(journal: Path) -> Counter[tuple[str, str]]:
    """The records in the journal's segments, by ("events", kind) or ("snapshots", ""), read from disk."""
    kept: Counter[tuple[str, str]] = Counter()
    for path in journal.glob(SEGMENT_GLOB):
        for _, _, payload in read_frames(path):
            request = ExportLogsServiceRequest.FromString(payload)
            for resource in request.resource_logs:
                for scope in resource.scope_logs:
                    for record in scope.log_records:
                        kept[_record_key(record)] += 1
    return kept


def _record_key(record: Any) -> tuple[str, str]:
    """A journaled log record's (view, kind) in `expected_records`' terms."""
    if record.event_name.startswith(wire.EVENT_PREFIX):
        return ("events", record.event_name.removeprefix(wire.EVENT_PREFIX))
    if record.event_name == wire.SNAPSHOT:
        return ("snapshots", "")
    if record.event_name == wire.TOOL_EFFECT:
        status = next(a.value.string_value for a in record.attributes if a.key == wire.EFFECT_STATUS)
        return ("effect_records", status)
    return (record.event_name, "")


# -- the report -------------------------------------------------------------------------------------


FULL = {"rounds": 5, "kills": 12, "outage": 30.0, "calls": 60, "bound": 2 << 20}
QUICK = {"rounds": 1, "kills": 4, "outage": 3.0, "calls": 10, "bound": 1 << 20}


def run_all(quick: bool) -> list[FaultResult]:
    """Every scenario at report size (`quick`: the fast size the test suite uses)."""
    size = QUICK if quick else FULL
    scenarios = [
        lambda: agent_kills(rounds=size["rounds"]),
        lambda: recorder_kills(kills=size["kills"]),
        lambda: recorder_outage(seconds=size["outage"]),
        lambda: journal_overflow(calls=size["calls"], bound=size["bound"]),
    ]
    results = []
    for scenario in scenarios:
        results.append(asyncio.run(scenario()))
        _progress(f"{results[-1].scenario}: {len(results[-1].problems)} problem(s)")
    return results


def section(results: list[FaultResult]) -> str:
    """The markdown section of the reliability report for these results."""
    lines = [
        "## Fault matrix",
        "",
        "Real processes on 127.0.0.1 and real signals (`python -m reliability.faults`, reliability/faults.py).",
        "",
        "| scenario | faults injected | records expected | stored | duplicates | lost | seconds | held |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        held = "yes" if not r.problems else f"**no** ({len(r.problems)} problems)"
        figures = [r.faults, r.expected, r.stored, r.duplicates, r.lost, f"{r.seconds:.1f}", held]
        lines.append(f"| {r.scenario} | " + " | ".join(map(str, figures)) + " |")
    lines.append("")
    for r in results:
        figures = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in r.notes.items())
        lines.append(f"- {r.scenario}: {figures}.")
        lines.extend(f"  - problem: {p}" for p in r.problems[:20])
    return "\n".join(lines) + "\n"


def main(quick: bool = False) -> str:
    return section(run_all(quick))


if __name__ == "__main__":
    print(main(quick="--quick" in sys.argv[1:]))
