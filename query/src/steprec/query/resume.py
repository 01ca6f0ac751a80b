"""continue_run and fork_run: a recorded run's history, ready for `Agent.run(message_history=...)`."""

from __future__ import annotations

from pydantic_ai.messages import ModelMessage
from steprec.proto import wire

from .client import RecorderClient
from .types import RecoveryReport


async def continue_run(client: RecorderClient, *, run_id: str, include_interrupted: bool = False) -> list[ModelMessage]:
    """The messages of the run's newest `complete` snapshot, to carry on where it stopped.

    `include_interrupted=True` also considers snapshots holding unsettled tool
    work (a crash mid-tool-cycle); check `list_unresolved_tool_effects` first,
    since pending calls may run again. Raises `LookupError` when nothing matches.
    """
    snapshot = await client.latest_snapshot(run_id, include_interrupted=include_interrupted)
    if snapshot is None:
        which = "snapshot" if include_interrupted else "complete snapshot"
        raise LookupError(f"no continuable {which} for run_id {run_id!r}")
    return list(snapshot.messages)


class ForkedHistory(list):
    """A fork's starting history (a `list[ModelMessage]`), with where it came from.

    Pass `metadata` to `Agent.run(..., metadata=fork.metadata)` and StepRecorder records the new run
    as a fork of `origin_run_id` at snapshot `origin_snapshot_index`; run trees then show it.
    """

    def __init__(self, messages: list[ModelMessage], *, origin_run_id: str, origin_snapshot_index: int) -> None:
        super().__init__(messages)
        self.origin_run_id = origin_run_id
        self.origin_snapshot_index = origin_snapshot_index

    @property
    def metadata(self) -> dict[str, str | int]:
        return {wire.FORKED_FROM_RUN_ID: self.origin_run_id, wire.FORKED_FROM_SNAPSHOT: self.origin_snapshot_index}


async def fork_run(
    client: RecorderClient, *, run_id: str, include_interrupted: bool = False, at: int | None = None
) -> ForkedHistory:
    """The history to start a new, branched run from: the newest snapshot (as `continue_run` picks
    it) or, with `at`, any retained snapshot by index, whatever its state.

    Raises `LookupError` when there is no such snapshot.
    """
    if at is None:
        snapshot = await client.latest_snapshot(run_id, include_interrupted=include_interrupted)
    else:
        snapshot = await client.get_snapshot(run_id, at)
    if snapshot is None:
        which = f"retained snapshot {at}" if at is not None else "continuable snapshot"
        raise LookupError(f"no {which} for run_id {run_id!r}")
    return ForkedHistory(snapshot.messages, origin_run_id=run_id, origin_snapshot_index=snapshot.snapshot_index)


async def inspect_recovery(client: RecorderClient, *, run_id: str) -> RecoveryReport:
    """Newest and newest settled snapshots, unresolved effects, and which tools completed or failed."""
    snapshots = await client.list_snapshots(run_id, include_interrupted=True)
    effects = await client.list_tool_effects(run_id)
    complete = [s for s in snapshots if s.state == "complete"]
    return RecoveryReport(
        run_id=run_id,
        newest_snapshot=snapshots[-1] if snapshots else None,
        newest_complete_snapshot=complete[-1] if complete else None,
        unresolved_effects=[e for e in effects if e.status == "started"],
        completed_tools=[e.tool_name for e in effects if e.status == "completed"],
        failed_tools=[e.tool_name for e in effects if e.status == "failed"],
    )
