"""Capability events StepRecorder emits for observers inside the agent."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic_ai import CapabilityEvent


@dataclass(kw_only=True)
class SnapshotSaved(CapabilityEvent, namespace="steprec", name="snapshot_saved"):
    """A snapshot was acknowledged by the recorder, or spooled while it was unreachable.

    `delivery` is `acknowledged`, `spooled` or `dropped` (spool full). The
    recorder, not this notification, is the source of truth.
    """

    run_id: str
    conversation_id: str | None
    step_index: int
    snapshot_index: int
    state: str
    delivery: str
