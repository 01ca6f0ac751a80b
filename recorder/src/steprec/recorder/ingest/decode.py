"""OTLP log records in, typed steprec records out; anything malformed becomes a `Refusal`.

This is the recorder's trust boundary: nothing past it sees protobuf, and
every field a stranger could have got wrong has been checked here, with a
reason a person can read. docs/wire-format.md is the contract. One check is
left to the write path, by design: whether a message body is a JSON object
(`check_message_json`). A body is content-addressed, so one whose digest the
store already holds is byte for byte one that passed the check when it was
stored; parsing every body again was a sixth of the recorder's time under
replayed real traffic, where most bodies are held already.
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass, field

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from steprec.proto import wire

_EVENT_NAMES = {wire.EVENT_PREFIX + kind: kind for kind in wire.EVENT_KINDS}
MAX_TEXT = 64 * 1024
"""Longest identifier, name, error or metadata value accepted (message bodies are not limited by this)."""


_INT32_MAX = 2**31 - 1
MAX_JSON_DEPTH = 200
"""Nesting a message's JSON may have: far beyond any pydantic-ai message, and shallow enough that the
store's recursive walks (media offloading) never meet Python's recursion limit, which failed a whole
request with 'could not commit' (found by reliability/fuzz.py)."""


def check_message_json(text: str, position: int) -> None:
    """Refuse a message body that is not a JSON object nesting at most MAX_JSON_DEPTH deep."""
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise Malformed("bad_body", f"body.{wire.BODY_MESSAGES}[{position}] is not valid JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise Malformed("bad_body", f"body.{wire.BODY_MESSAGES}[{position}] must be a JSON object")
    # Nesting cannot exceed the number of brackets: most bodies need no walk.
    if text.count("{") + text.count("[") > MAX_JSON_DEPTH and _depth(parsed) > MAX_JSON_DEPTH:
        raise Malformed("bad_body", f"body.{wire.BODY_MESSAGES}[{position}] nests deeper than {MAX_JSON_DEPTH}")


def _depth(tree: object) -> int:
    """How deeply lists and objects nest in `tree`, walked without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_JSON_DEPTH:
            stack.extend((child, depth + 1) for child in children)
    return deepest


_LATEST_NANO = 2**63 - 1
"""OTLP times are unsigned 64-bit, the store's are signed (up to 2262-04-11): a later one is refused here,
since one the log acknowledged but DuckDB could not take would stall every record behind it."""


class Malformed(ValueError):
    """A record that cannot be stored; its message says why."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code


@dataclass(frozen=True, slots=True)
class Refusal:
    """A refused record: its index in the request, a machine code and a reason."""

    index: int
    code: str
    reason: str

    def line(self) -> str:
        return f"record {self.index} [{self.code}]: {self.reason}"


@dataclass(frozen=True, slots=True)
class Lineage:
    """What every steprec record carries."""

    index: int
    run_id: str
    step_index: int
    at_unix_nano: int
    conversation_id: str | None
    parent_run_id: str | None
    agent_name: str | None
    idempotency_key: str | None
    trace_id: str | None
    span_id: str | None


@dataclass(frozen=True, slots=True)
class StepEventRecord:
    lineage: Lineage
    kind: str
    tool_call_id: str | None
    tool_name: str | None
    error: str | None
    metadata: dict[str, str]
    registration_id: str | None
    max_snapshots: int | None
    forked_from_run_id: str | None = None
    forked_from_snapshot: int | None = None


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    lineage: Lineage
    snapshot_index: int
    state: str
    base_index: int | None
    keep: int
    append_refs: tuple[bytes, ...]
    messages: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ToolEffectRecord:
    lineage: Lineage
    status: str
    tool_call_id: str
    tool_name: str
    error: str | None
    idempotency_key: str | None
    effect_summary: str | None


@dataclass(frozen=True, slots=True)
class MessageFragmentRecord:
    lineage: Lineage
    digest: bytes
    index: int
    count: int
    data: bytes


StepRecord = StepEventRecord | SnapshotRecord | ToolEffectRecord | MessageFragmentRecord


def _plain(value: AnyValue, *, depth: int = 0) -> object:
    """An AnyValue as a Python value (nested up to a small depth)."""
    if depth > 4:
        raise Malformed("bad_body", "value nested more than 4 levels deep")
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_plain(v, depth=depth + 1) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _plain(kv.value, depth=depth + 1) for kv in value.kvlist_value.values}
    return getattr(value, kind)


@functools.lru_cache(maxsize=4096)
def _is_run_id(text: str) -> bool:
    """A run id's form, remembered for the ids seen lately: each record carries one or two."""
    return wire.is_run_id(text)


class _Fields:
    """Typed access to one record's attributes, with errors that name the attribute.

    Each attribute's value is read out of protobuf once, as `(oneof, value)`: a record carries
    about six and is asked for about twelve, most of them absent.
    """

    def __init__(self, record: LogRecord) -> None:
        self.values: dict[str, tuple[str, object]] = {}
        for kv in record.attributes:
            value = kv.value
            if (oneof := value.WhichOneof("value")) is not None:
                self.values[kv.key] = (oneof, getattr(value, oneof))
            else:
                self.values.pop(kv.key, None)  # an empty value replaces an earlier one, as a later key does

    def _get(self, name: str, oneof: str, what: str, required: bool):
        found = self.values.get(name)
        if found is None:
            if required:
                raise Malformed("missing_attribute", f"attribute {name} is required")
            return None
        if found[0] != oneof:
            raise Malformed("bad_attribute", f"attribute {name} must be {what}, got {found[0]}")
        return found[1]

    def text(self, name: str, *, required: bool = False) -> str | None:
        text = self._get(name, "string_value", "a string", required)
        if text is not None and len(text) > MAX_TEXT:
            raise Malformed("bad_attribute", f"attribute {name} is longer than {MAX_TEXT} characters")
        return text

    def integer(self, name: str, *, required: bool = False, minimum: int = 0) -> int | None:
        """An int attribute within [minimum, 2**31 - 1]: every integer column it lands in is 32-bit, and a
        value DuckDB could not store would be acknowledged and then fail every apply of the log."""
        number = self._get(name, "int_value", "an integer", required)
        if number is not None and not minimum <= number <= _INT32_MAX:
            raise Malformed("bad_attribute", f"attribute {name} must be {minimum} to {_INT32_MAX}, got {number}")
        return number

    def run_id(self, name: str, *, required: bool = False) -> str | None:
        run_id = self.text(name, required=required)
        if run_id is not None and not _is_run_id(run_id):
            raise Malformed(
                "bad_run_id", f"attribute {name} {run_id[:80]!r} is not 1-200 of [A-Za-z0-9_.-] without '..'"
            )
        return run_id


def _body(record: LogRecord) -> dict[str, object]:
    if record.body.WhichOneof("value") is None:
        return {}
    body = _plain(record.body)
    if not isinstance(body, dict):
        raise Malformed("bad_body", "body must be a key-value list")
    return body


def _lineage(index: int, record: LogRecord, fields: _Fields) -> Lineage:
    at = record.time_unix_nano or record.observed_time_unix_nano or time.time_ns()
    if at > _LATEST_NANO:
        raise Malformed("bad_attribute", f"time_unix_nano {at} is past {_LATEST_NANO}, the latest instant stored")
    return Lineage(
        index=index,
        run_id=fields.run_id(wire.RUN_ID, required=True),
        step_index=fields.integer(wire.STEP_INDEX, required=True),
        at_unix_nano=at,
        conversation_id=fields.text(wire.CONVERSATION_ID),
        parent_run_id=fields.run_id(wire.PARENT_RUN_ID),
        agent_name=fields.text(wire.AGENT_NAME),
        idempotency_key=fields.text(wire.IDEMPOTENCY_KEY),
        trace_id=_hex_id(record.trace_id),
        span_id=_hex_id(record.span_id),
    )


def _hex_id(raw: bytes) -> str | None:
    """A trace or span id as hex; None when unset (empty or all zero bytes, as OTLP means it)."""
    return raw.hex() if raw.strip(b"\0") else None


def _error_text(fields: _Fields) -> str | None:
    return fields.text(wire.ERROR_MESSAGE)


def _metadata(body: dict[str, object]) -> dict[str, str]:
    metadata = body.get(wire.BODY_METADATA) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) and len(v) <= MAX_TEXT for v in metadata.values()):
        raise Malformed("bad_body", "body.metadata must map strings to strings")
    return metadata


def _step_event(lineage: Lineage, kind: str, fields: _Fields, body: dict[str, object]) -> StepEventRecord:
    registration_id = fields.text(wire.REGISTRATION_ID, required=kind == "run_started")
    if registration_id is not None and "\x00" in registration_id:  # a lake claims it in PostgreSQL, whose text has none
        raise Malformed("bad_attribute", f"attribute {wire.REGISTRATION_ID} holds a NUL character")
    return StepEventRecord(
        lineage=lineage,
        kind=kind,
        tool_call_id=fields.text(wire.TOOL_CALL_ID),
        tool_name=fields.text(wire.TOOL_NAME),
        error=_error_text(fields),
        metadata=_metadata(body),
        registration_id=registration_id,
        max_snapshots=fields.integer(wire.MAX_SNAPSHOTS, minimum=1),
        forked_from_run_id=fields.run_id(wire.FORKED_FROM_RUN_ID),
        forked_from_snapshot=fields.integer(wire.FORKED_FROM_SNAPSHOT),
    )


def _snapshot(lineage: Lineage, fields: _Fields, body: dict[str, object]) -> SnapshotRecord:
    state = fields.text(wire.SNAPSHOT_STATE, required=True)
    if state not in wire.SNAPSHOT_STATES:
        raise Malformed(
            "bad_attribute", f"attribute {wire.SNAPSHOT_STATE} must be complete or interrupted, got {state!r}"
        )
    refs = body.get(wire.BODY_APPEND_REFS, b"")
    if not isinstance(refs, bytes) or len(refs) % wire.DIGEST_SIZE:
        raise Malformed("bad_body", f"body.{wire.BODY_APPEND_REFS} must be bytes holding whole 32-byte SHA-256 digests")
    messages = body.get(wire.BODY_MESSAGES) or []
    if not isinstance(messages, list) or not all(isinstance(m, str) for m in messages):
        raise Malformed("bad_body", f"body.{wire.BODY_MESSAGES} must be a list of JSON strings")
    keep = fields.integer(wire.SNAPSHOT_KEEP, required=True)
    base_index = fields.integer(wire.SNAPSHOT_BASE_INDEX)
    if keep and base_index is None:
        raise Malformed("bad_attribute", f"{wire.SNAPSHOT_KEEP} is {keep} but no {wire.SNAPSHOT_BASE_INDEX} is given")
    return SnapshotRecord(
        lineage=lineage,
        snapshot_index=fields.integer(wire.SNAPSHOT_INDEX, required=True),
        state=state,
        base_index=base_index,
        keep=keep,
        append_refs=tuple(refs[i : i + wire.DIGEST_SIZE] for i in range(0, len(refs), wire.DIGEST_SIZE)),
        messages=messages,
    )


def _tool_effect(lineage: Lineage, fields: _Fields, body: dict[str, object]) -> ToolEffectRecord:
    status = fields.text(wire.EFFECT_STATUS, required=True)
    if status not in wire.EFFECT_STATUSES:
        raise Malformed(
            "bad_attribute", f"attribute {wire.EFFECT_STATUS} must be one of {', '.join(wire.EFFECT_STATUSES)}"
        )
    annotations = {}
    for key in (wire.BODY_EFFECT_IDEMPOTENCY_KEY, wire.BODY_EFFECT_SUMMARY):
        value = body.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > MAX_TEXT):
            raise Malformed("bad_body", f"body.{key} must be a string of at most {MAX_TEXT} characters")
        annotations[key] = value
    return ToolEffectRecord(
        lineage=lineage,
        status=status,
        tool_call_id=fields.text(wire.TOOL_CALL_ID, required=True),
        tool_name=fields.text(wire.TOOL_NAME, required=True),
        error=_error_text(fields),
        idempotency_key=annotations[wire.BODY_EFFECT_IDEMPOTENCY_KEY],
        effect_summary=annotations[wire.BODY_EFFECT_SUMMARY],
    )


def _message_fragment(lineage: Lineage, fields: _Fields, body: dict[str, object]) -> MessageFragmentRecord:
    digest = fields.text(wire.FRAGMENT_DIGEST, required=True)
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise Malformed("bad_attribute", f"attribute {wire.FRAGMENT_DIGEST} must be 64 lowercase hex digits")
    count = fields.integer(wire.FRAGMENT_COUNT, required=True, minimum=1)
    index = fields.integer(wire.FRAGMENT_INDEX, required=True)
    if index >= count:
        raise Malformed("bad_attribute", f"fragment index {index} is not below its count {count}")
    data = body.get(wire.BODY_FRAGMENT_DATA)
    if not isinstance(data, bytes) or not data or len(data) > wire.FRAGMENT_BYTES:
        raise Malformed("bad_body", f"body.{wire.BODY_FRAGMENT_DATA} must be 1 to {wire.FRAGMENT_BYTES} bytes")
    return MessageFragmentRecord(lineage, bytes.fromhex(digest), index, count, data)


def decode_record(index: int, record: LogRecord) -> StepRecord:
    """One OTLP log record as a steprec record; raises `Malformed` with the reason."""
    event_name = record.event_name
    fields = _Fields(record)
    lineage = _lineage(index, record, fields)
    body = _body(record)
    if (kind := _EVENT_NAMES.get(event_name)) is not None:
        return _step_event(lineage, kind, fields, body)
    if event_name == wire.SNAPSHOT:
        return _snapshot(lineage, fields, body)
    if event_name == wire.TOOL_EFFECT:
        return _tool_effect(lineage, fields, body)
    if event_name == wire.MESSAGE_FRAGMENT:
        return _message_fragment(lineage, fields, body)
    raise Malformed("unknown_event", f"event_name {event_name[:80]!r} is not a steprec record")


def decode_request(request: ExportLogsServiceRequest) -> tuple[list[StepRecord], list[Refusal]]:
    """Every record of an export request, in order, each either decoded or refused."""
    records: list[StepRecord] = []
    refusals: list[Refusal] = []
    index = 0
    for resource_logs in request.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                try:
                    records.append(decode_record(index, record))
                except Malformed as error:
                    refusals.append(Refusal(index, error.code, str(error)))
                index += 1
    return records, refusals
