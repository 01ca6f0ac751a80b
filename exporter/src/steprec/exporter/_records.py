"""Turning step-persistence facts into OTLP log records (docs/wire-format.md).

Each function builds one `Record`: the encoded protobuf `LogRecord` (`_otlp`)
and its event name. Its trace and span ids come from the OpenTelemetry
context active at the call, so a step lines up with pydantic-ai's own spans.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry import trace
from steprec.proto import wire

from . import _otlp

_INFO, _ERROR = 9, 17
"""OpenTelemetry severity numbers."""


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class Record:
    """One encoded log record; compared by identity, which is how a refusal finds the record it refused.

    Weakly referenceable: delivery remembers which records a journal frame carries without
    keeping their bytes alive while the recorder is unreachable (the bytes are on disk).
    """

    event_name: str
    data: bytes


@dataclass(frozen=True)
class RunScope:
    """The lineage every record of one run carries."""

    run_id: str
    conversation_id: str | None
    parent_run_id: str | None
    agent_name: str | None
    metadata: Mapping[str, str] = field(default_factory=dict)
    _shared: bytes = field(default=b"", init=False, repr=False, compare=False)
    _event_body: bytes = field(default=b"", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # What every record of the run repeats, encoded once per run.
        shared = {wire.RUN_ID: self.run_id}
        for name, value in (
            (wire.CONVERSATION_ID, self.conversation_id),
            (wire.PARENT_RUN_ID, self.parent_run_id),
            (wire.AGENT_NAME, self.agent_name),
        ):
            if value is not None:
                shared[name] = value
        object.__setattr__(self, "_shared", _otlp.attributes(shared.items()))
        object.__setattr__(self, "_event_body", _otlp.any_value({wire.BODY_METADATA: dict(self.metadata)}))

    def attributes(self, step_index: int, idempotency_key: str | None, *extra: tuple[str, object]) -> bytes:
        """This run's attributes, the record's step and key, and `extra` (None values left out), encoded."""
        key = _otlp.attribute(wire.IDEMPOTENCY_KEY, idempotency_key) if idempotency_key is not None else b""
        return self._shared + key + _otlp.attributes(((wire.STEP_INDEX, step_index), *extra))


@dataclass(frozen=True)
class ErrorText:
    """An exception as text: its class name and `repr`, the reference's error string."""

    type: str
    text: str

    @classmethod
    def of(cls, error: BaseException) -> ErrorText:
        return cls(type(error).__qualname__, repr(error))


def _error_attributes(error: ErrorText | None) -> tuple[tuple[str, str], ...]:
    return ((wire.ERROR_TYPE, error.type), (wire.ERROR_MESSAGE, error.text)) if error is not None else ()


def _record(
    event_name: str, attributes: bytes, body: bytes, *, error: bool = False, at_unix_nano: int | None = None
) -> Record:
    now = time.time_ns()
    context = trace.get_current_span().get_span_context()
    traced = context.is_valid
    return Record(
        event_name,
        _otlp.log_record(
            time_unix_nano=now if at_unix_nano is None else at_unix_nano,
            observed_unix_nano=now,
            severity_number=_ERROR if error else _INFO,
            event_name=event_name,
            encoded_attributes=attributes,
            body=body,
            trace_id=context.trace_id.to_bytes(16, "big") if traced else b"",
            span_id=context.span_id.to_bytes(8, "big") if traced else b"",
            trace_flags=context.trace_flags if traced else 0,
        ),
    )


def step_event(
    scope: RunScope,
    kind: str,
    *,
    step_index: int,
    idempotency_key: str,
    tool_call_id: str | None = None,
    tool_name: str | None = None,
    error: ErrorText | None = None,
    registration_id: str | None = None,
    max_snapshots: int | None = None,
    forked_from: tuple[str, int] | None = None,
    at_unix_nano: int | None = None,
) -> Record:
    """One of the nine step events; `run_started` also registers the run id.

    `at_unix_nano` (every builder takes it) is when the fact happened, for a caller that knows
    better than "now": a store handed records that carry their own timestamps.
    """
    attributes = scope.attributes(
        step_index,
        idempotency_key,
        (wire.TOOL_CALL_ID, tool_call_id),
        (wire.TOOL_NAME, tool_name),
        (wire.REGISTRATION_ID, registration_id),
        (wire.MAX_SNAPSHOTS, max_snapshots),
        (wire.FORKED_FROM_RUN_ID, forked_from[0] if forked_from else None),
        (wire.FORKED_FROM_SNAPSHOT, forked_from[1] if forked_from else None),
        *_error_attributes(error),
    )
    return _record(
        wire.EVENT_PREFIX + kind, attributes, scope._event_body, error=error is not None, at_unix_nano=at_unix_nano
    )


def snapshot(
    scope: RunScope,
    *,
    snapshot_index: int,
    step_index: int,
    state: str,
    idempotency_key: str,
    base_index: int | None,
    keep: int,
    append_refs: bytes,
    new_messages: list[str],
    at_unix_nano: int | None = None,
) -> Record:
    """A continuable snapshot, sent as a delta of the run's previous one.

    The history is the first `keep` references of snapshot `base_index`
    followed by `append_refs`; `new_messages` carries the JSON of every
    referenced message this run has not sent before, so each distinct message
    crosses the wire once per run.
    """
    attributes = scope.attributes(
        step_index,
        idempotency_key,
        (wire.SNAPSHOT_INDEX, snapshot_index),
        (wire.SNAPSHOT_STATE, state),
        (wire.SNAPSHOT_KEEP, keep),
        (wire.SNAPSHOT_BASE_INDEX, base_index),
    )
    body = _otlp.any_value({wire.BODY_APPEND_REFS: append_refs, wire.BODY_MESSAGES: new_messages})
    return _record(wire.SNAPSHOT, attributes, body, at_unix_nano=at_unix_nano)


def tool_effect(
    scope: RunScope,
    status: str,
    *,
    step_index: int,
    record_key: str,
    tool_call_id: str,
    tool_name: str,
    idempotency_key: str | None = None,
    effect_summary: str | None = None,
    error: ErrorText | None = None,
    at_unix_nano: int | None = None,
) -> Record:
    """A tool-effect ledger entry.

    `record_key` suppresses a redelivered copy of this record, like an event's
    key; `idempotency_key` is the tool's own annotation of its side effect.
    """
    attributes = scope.attributes(
        step_index,
        record_key,
        (wire.EFFECT_STATUS, status),
        (wire.TOOL_CALL_ID, tool_call_id),
        (wire.TOOL_NAME, tool_name),
        *_error_attributes(error),
    )
    body: dict[str, str] = {}
    if idempotency_key is not None:
        body[wire.BODY_EFFECT_IDEMPOTENCY_KEY] = idempotency_key
    if effect_summary is not None:
        body[wire.BODY_EFFECT_SUMMARY] = effect_summary
    return _record(
        wire.TOOL_EFFECT, attributes, _otlp.any_value(body), error=error is not None, at_unix_nano=at_unix_nano
    )


def message_fragment(scope: RunScope, *, step_index: int, digest: str, index: int, count: int, data: bytes) -> Record:
    """One piece of a message too large for one request (see `wire.FRAGMENT_BYTES`)."""
    attributes = scope.attributes(
        step_index,
        f"fragment:{digest}:{index}",
        (wire.FRAGMENT_DIGEST, digest),
        (wire.FRAGMENT_INDEX, index),
        (wire.FRAGMENT_COUNT, count),
    )
    return _record(wire.MESSAGE_FRAGMENT, attributes, _otlp.any_value({wire.BODY_FRAGMENT_DATA: data}))


def split_large_messages(
    scope: RunScope, *, step_index: int, new_messages: list[str]
) -> tuple[list[str], list[Record]]:
    """A snapshot's new messages that travel inline, and the fragment records to send before it.

    A message over `wire.FRAGMENT_BYTES` would bring a request near gRPC's 4 MiB default cap, so
    it goes ahead in pieces and the snapshot refers to it by digest only.
    """
    inline, fragments = [], []
    for text in new_messages:
        encoded = text.encode()
        if len(encoded) <= wire.FRAGMENT_BYTES:
            inline.append(text)
            continue
        digest = hashlib.sha256(encoded).hexdigest()
        count = -(-len(encoded) // wire.FRAGMENT_BYTES)
        for index in range(count):
            piece = encoded[index * wire.FRAGMENT_BYTES : (index + 1) * wire.FRAGMENT_BYTES]
            fragments.append(
                message_fragment(scope, step_index=step_index, digest=digest, index=index, count=count, data=piece)
            )
    return inline, fragments
