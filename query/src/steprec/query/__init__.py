"""Reading recorded runs back from a steprec recorder: RecorderClient, continue_run, fork_run; ConversationStore.

`RecorderStepStore` (pydantic-ai-harness's StepStore on a recorder) loads on first use, so this
package imports without the `harness` extra it needs.
"""

from .client import RecorderBusy, RecorderClient, RecorderUnavailable, truncated
from .conversation_types import (
    ConversationConflict,
    ConversationSummary,
    GitCheckout,
    SavedConversation,
    conversation_text,
)
from .conversations import ConversationStore
from .resume import ForkedHistory, continue_run, fork_run, inspect_recovery
from .sync import SyncRecorderClient
from .types import RecoveryReport, RunRecord, RunTree, Snapshot, SnapshotSummary, StepEvent, ToolEffectRecord

__all__ = [
    "ConversationConflict",
    "ConversationStore",
    "ConversationSummary",
    "ForkedHistory",
    "GitCheckout",
    "RecorderBusy",
    "RecorderClient",
    "RecorderUnavailable",
    "RecoveryReport",
    "RunRecord",
    "RunTree",
    "SavedConversation",
    "Snapshot",
    "SnapshotSummary",
    "StepEvent",
    "SyncRecorderClient",
    "ToolEffectRecord",
    "continue_run",
    "conversation_text",
    "fork_run",
    "inspect_recovery",
    "truncated",
]


def __getattr__(name: str) -> object:
    if name == "RecorderStepStore":
        from .step_store import RecorderStepStore

        return RecorderStepStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
