"""What RecorderClient returns: typed records shaped like pydantic-ai-harness's, never raw protobuf."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic_ai.messages import ModelMessage

RunOutcome = Literal["running", "completed", "failed"]
SnapshotState = Literal["complete", "interrupted"]
ToolEffectStatus = Literal["started", "completed", "failed"]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def from_unix_nano(value: int) -> datetime:
    """Unix nanoseconds as a UTC datetime, exact to the microsecond (a float division can be one off)."""
    return _EPOCH + timedelta(microseconds=value // 1000)


def to_unix_nano(value: datetime) -> int:
    """A datetime as Unix nanoseconds; a naive one is taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // timedelta(microseconds=1) * 1000


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """Lineage of one `Agent.run`, and how it ended so far."""

    run_id: str
    conversation_id: str | None
    parent_run_id: str | None
    agent_name: str | None
    metadata: dict[str, str]
    started_at: datetime
    ended_at: datetime | None
    outcome: RunOutcome
    registration_id: str
    forked_from_run_id: str | None = None
    """Set on a fork: the run whose snapshot `forked_from_snapshot_index` it started from."""
    forked_from_snapshot_index: int | None = None


@dataclass(frozen=True, kw_only=True)
class StepEvent:
    """One boundary of a run (run, model request or tool call started/completed/failed)."""

    run_id: str
    kind: str
    step_index: int
    timestamp: datetime
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    error: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    idempotency_key: str | None = None
    trace_id: str | None = None
    span_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """A continuable message history; pass `messages` to `Agent.run(message_history=...)`."""

    run_id: str
    snapshot_index: int
    step_index: int
    state: SnapshotState
    timestamp: datetime
    messages: list[ModelMessage]
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    idempotency_key: str | None = None


@dataclass(frozen=True, kw_only=True)
class SnapshotSummary:
    """A retained snapshot without its messages: what `list_snapshots` returns."""

    run_id: str
    snapshot_index: int
    step_index: int
    state: SnapshotState
    timestamp: datetime
    message_count: int
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    idempotency_key: str | None = None


@dataclass(frozen=True, kw_only=True)
class ToolEffectRecord:
    """A tool call's side-effect status; `started` with no end means unknown after a crash."""

    run_id: str
    tool_call_id: str
    tool_name: str
    status: ToolEffectStatus
    started_at: datetime
    ended_at: datetime | None = None
    idempotency_key: str | None = None
    effect_summary: str | None = None


@dataclass(frozen=True, kw_only=True)
class RecoveryReport:
    """What a run left behind for deciding how to resume it (the reference's `inspect_recovery`).

    It states facts; it does not infer that any effect is safe to replay.
    """

    run_id: str
    newest_snapshot: SnapshotSummary | None
    newest_complete_snapshot: SnapshotSummary | None
    unresolved_effects: list[ToolEffectRecord]
    completed_tools: list[str]
    failed_tools: list[str]


@dataclass(frozen=True, kw_only=True)
class RunTree:
    """A run and the runs it spawned, recursively: walk `children` to see the whole delegation."""

    run: RunRecord
    children: list[RunTree]

    def walk(self, depth: int = 0):
        """(depth, run) for this run and every descendant, parents before their children."""
        yield depth, self.run
        for child in self.children:
            yield from child.walk(depth + 1)
