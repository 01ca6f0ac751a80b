"""continue_run and fork_run: a recorded run's history, ready for `Agent.run(message_history=...)`."""

from __future__ import annotations

from pydantic_ai.messages import ModelMessage

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


async def fork_run(client: RecorderClient, *, run_id: str, include_interrupted: bool = False) -> list[ModelMessage]:
    """The same history as `continue_run`, meant to start a new, branched run from it."""
    return await continue_run(client, run_id=run_id, include_interrupted=include_interrupted)


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
