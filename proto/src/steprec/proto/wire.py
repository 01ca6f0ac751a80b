"""Names of the OTLP log records steprec sends: the one vocabulary exporter and recorder share.

docs/wire-format.md is the prose version of this module; keep them in step.
OpenTelemetry GenAI attribute names are used where one exists, `steprec.` names
for the rest, so a record reads sensibly in any OTLP backend.
"""

from __future__ import annotations

import re
from typing import Final

SCOPE_NAME: Final = "steprec.exporter"

# event_name of each record kind. The nine step events keep the step-persistence
# EventKind vocabulary after the namespace prefix.
EVENT_PREFIX: Final = "steprec.event."
EVENT_KINDS: Final = (
    "run_started",
    "run_completed",
    "run_failed",
    "model_request_started",
    "model_request_completed",
    "model_request_failed",
    "tool_call_started",
    "tool_call_completed",
    "tool_call_failed",
)
SNAPSHOT: Final = "steprec.snapshot"
TOOL_EFFECT: Final = "steprec.tool_effect"
MESSAGE_FRAGMENT: Final = "steprec.message_fragment"
"""A piece of a message too large for one request; sent before the snapshot that refers to it."""

# Attributes every record carries (those that are known).
RUN_ID: Final = "steprec.run.id"
PARENT_RUN_ID: Final = "steprec.run.parent_id"
CONVERSATION_ID: Final = "gen_ai.conversation.id"
AGENT_NAME: Final = "gen_ai.agent.name"
STEP_INDEX: Final = "steprec.step.index"
IDEMPOTENCY_KEY: Final = "steprec.idempotency_key"

# Step events.
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_NAME: Final = "gen_ai.tool.name"
ERROR_TYPE: Final = "error.type"
ERROR_MESSAGE: Final = "steprec.error"
# run_started only: the registration that claims the run id, and retention.
REGISTRATION_ID: Final = "steprec.run.registration_id"
MAX_SNAPSHOTS: Final = "steprec.retention.max_snapshots"
# run_started of a fork: the run and snapshot its history came from. The same names are the keys a
# caller puts in `Agent.run(metadata=...)` (what `ForkedHistory.metadata` holds).
FORKED_FROM_RUN_ID: Final = "steprec.run.forked_from.run_id"
FORKED_FROM_SNAPSHOT: Final = "steprec.run.forked_from.snapshot_index"

# Snapshots.
SNAPSHOT_INDEX: Final = "steprec.snapshot.index"
SNAPSHOT_STATE: Final = "steprec.snapshot.state"
SNAPSHOT_BASE_INDEX: Final = "steprec.snapshot.base_index"
SNAPSHOT_KEEP: Final = "steprec.snapshot.keep"
SNAPSHOT_STATES: Final = ("complete", "interrupted")

# Message fragments.
FRAGMENT_DIGEST: Final = "steprec.message.digest"
"""Hex SHA-256 of the whole message's JSON bytes."""
FRAGMENT_INDEX: Final = "steprec.fragment.index"
FRAGMENT_COUNT: Final = "steprec.fragment.count"
BODY_FRAGMENT_DATA: Final = "data"
FRAGMENT_BYTES: Final = 1 << 20
"""Messages whose JSON is larger than this travel as fragments of at most this many bytes."""

# Tool effects.
EFFECT_STATUS: Final = "steprec.tool_effect.status"
EFFECT_STATUSES: Final = ("started", "completed", "failed", "annotated")

# Body keys (the body is a key-value list).
BODY_METADATA: Final = "metadata"
BODY_APPEND_REFS: Final = "append_refs"
BODY_MESSAGES: Final = "messages"
BODY_EFFECT_IDEMPOTENCY_KEY: Final = "idempotency_key"
BODY_EFFECT_SUMMARY: Final = "effect_summary"

DIGEST_SIZE: Final = 32
"""Message references are raw SHA-256 digests of the message's JSON bytes."""


def split_digests(blob: bytes) -> tuple[bytes, ...]:
    """Digests sent or stored concatenated (snapshot references, ReadMessages) as a tuple."""
    return tuple([blob[i : i + DIGEST_SIZE] for i in range(0, len(blob), DIGEST_SIZE)])  # a list is built faster


_RUN_ID_FORM = re.compile(r"[A-Za-z0-9_.-]{1,200}")
RUN_ID_RULE: Final = "1-200 of [A-Za-z0-9_.-] without '..'"
"""What a run id may be: safe in a path, a URL and a log line, whoever sent it."""


def is_run_id(text: str) -> bool:
    return _RUN_ID_FORM.fullmatch(text) is not None and ".." not in text


# Partial-success reasons the exporter acts on. The recorder writes one line per
# refused record, `record <index> [<code>]: <explanation>`, joined by newlines.
REFUSED_RUN_ID_TAKEN: Final = "run_id_taken"
