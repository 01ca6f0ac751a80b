"""Capability events StepRecorder emits for observers inside the agent."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic_ai import CapabilityEvent


@dataclass(kw_only=True)
class SnapshotSaved(CapabilityEvent, namespace="steprec", name="snapshot_saved"):
    """A snapshot was made durable: journaled on disk, or acknowledged by the recorder.

    `delivery` is `journaled` (in this process's journal on disk), `acknowledged` (by the
    recorder) or `dropped` (journal full). The recorder, not this notification, is the source
    of truth.
    """

    run_id: str
    conversation_id: str | None
    step_index: int
    snapshot_index: int
    state: str
    delivery: str
