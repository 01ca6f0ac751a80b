"""continue_run and fork_run: a recorded run's history, ready for `Agent.run(message_history=...)`."""

from __future__ import annotations

from pydantic_ai.messages import ModelMessage

from .client import RecorderClient


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
