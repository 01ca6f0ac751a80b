"""Reading recorded runs back from a steprec recorder: RecorderClient, continue_run, fork_run."""

from .client import RecorderClient, RecorderUnavailable
from .resume import ForkedHistory, continue_run, fork_run, inspect_recovery
from .sync import SyncRecorderClient
from .types import RecoveryReport, RunRecord, RunTree, Snapshot, SnapshotSummary, StepEvent, ToolEffectRecord

__all__ = [
    "ForkedHistory",
    "RecorderClient",
    "RecorderUnavailable",
    "RecoveryReport",
    "RunRecord",
    "RunTree",
    "Snapshot",
    "SnapshotSummary",
    "StepEvent",
    "SyncRecorderClient",
    "ToolEffectRecord",
    "continue_run",
    "fork_run",
    "inspect_recovery",
]
