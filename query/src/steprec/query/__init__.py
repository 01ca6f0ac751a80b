"""Reading recorded runs back from a steprec recorder: RecorderClient, continue_run, fork_run."""

from .client import RecorderClient, RecorderUnavailable
from .resume import continue_run, fork_run
from .types import RunRecord, Snapshot, StepEvent, ToolEffectRecord

__all__ = [
    "RecorderClient",
    "RecorderUnavailable",
    "RunRecord",
    "Snapshot",
    "StepEvent",
    "ToolEffectRecord",
    "continue_run",
    "fork_run",
]
