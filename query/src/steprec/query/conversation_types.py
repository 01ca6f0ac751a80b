"""The conversation-head records `ConversationStore` takes and returns, shaped like pydantic-ai-harness 0.62.0's
(`step_persistence/conversations.py`), so code written against `SqliteConversationStore` keeps working."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal
from uuid import uuid4

from pydantic_ai.messages import ModelMessage, TextContent, TextPart, UserPromptPart


class ConversationConflict(ValueError):
    """Another writer changed or deleted this conversation, or its run is still busy. Reload before writing."""


@dataclass(frozen=True, kw_only=True)
class GitCheckout:
    """The Git checkout a conversation's workspace was in, so a browser can group it after the folder is gone."""

    repository: str
    """The repository's common Git directory, the same for each of its worktrees."""
    name: str
    """The repository's display name."""
    root: str
    """The checkout's top-level folder."""
    branch: str = ""
    """The checked-out branch, or a label for a detached checkout."""


@dataclass(frozen=True, kw_only=True)
class ConversationSummary:
    """Browser metadata. Naming and archiving change neither the activity time nor the content revision."""

    schema_version: Literal[1] = 1
    id: str = field(default_factory=lambda: str(uuid4()))
    workspace: str
    checkout: GitCheckout | None = None
    """The Git checkout `workspace` was in when saved; `None` outside Git or when the application records none."""
    updated_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    """The last content save, as the recorder's clock has it."""
    revision: int = 0
    title: str = "New session"
    subtitle: str = ""
    tags: tuple[str, ...] = ()
    title_source: Literal["fallback", "generated", "user"] = "fallback"
    naming_version: int = 0
    named_revision: int = 0
    model: str | None = None
    outcome: Literal["ready", "running", "completed", "failed", "cancelled"] = "ready"
    run_id: str | None = None
    owner_pid: int | None = None
    message_count: int = 0
    total_tokens: int = 0
    naming_tokens: int = 0
    archived_at: datetime | None = None
    """When the conversation was archived, which `listing(archived=False)` leaves out; `None` when it is not.

    A content save of an existing conversation clears it.
    """
    owner_host: str | None = None
    """The host `owner_pid` runs on (steprec's addition: one recorder serves many hosts). `save` fills it in
    with this host's name when `owner_pid` is set and it is not; `None` reads as the reader's own host."""


@dataclass(kw_only=True)
class SavedConversation:
    """An authoritative history plus its separately editable metadata."""

    summary: ConversationSummary
    messages: list[ModelMessage]


def conversation_text(messages: Sequence[ModelMessage]) -> str:
    """Searchable user and assistant text (text inside multimodal prompts too); not tool output, not reasoning."""
    lines: list[str] = []
    for message in messages:
        for part in message.parts:
            if isinstance(part, TextPart):
                lines.append(f"assistant: {part.content}")
            elif isinstance(part, UserPromptPart):
                items = [part.content] if isinstance(part.content, str) else part.content
                for item in items:
                    if isinstance(item, str):
                        lines.append(f"user: {item}")
                    elif isinstance(item, TextContent):
                        lines.append(f"user: {item.content}")
    return "\n".join(lines)
