"""Generated hostile OTLP input against a real recorder: it never crashes or hangs, each bad input gets a clear
refusal, and good records sent alongside are stored.

The generators and the checks here are shared: tests/test_hostile_queries.py fuzzes the query side with them,
and reliability/fuzz.py runs both for 100,000 inputs. This file is the fast version for the normal suite.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from steprec.proto import wire
from steprec.proto.framing import encode_frame, read_frames
from steprec.query import SyncRecorderClient
from steprec.recorder.daemon.process import RecorderProcess
from steprec.recorder.store.media import LITERAL, MARKER, URI_PREFIX

EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
DEADLINE = 30.0
"""Seconds any one call may take before it counts as a hang (the fuzzed SQL time limits are at most 1 s)."""
REFUSAL_CODES = {"unknown_event", "missing_attribute", "bad_attribute", "bad_run_id", "bad_body", "unknown_message",
                 "unknown_base", "run_id_taken", "too_large"}  # fmt: skip
"""docs/wire-format.md's codes: a refusal with any other is a finding."""
EVENT_NAMES = [wire.EVENT_PREFIX + kind for kind in wire.EVENT_KINDS]
KNOWN_NAMES = [*EVENT_NAMES, wire.SNAPSHOT, wire.TOOL_EFFECT, wire.MESSAGE_FRAGMENT]
KNOWN_KEYS = [wire.RUN_ID, wire.STEP_INDEX, wire.SNAPSHOT_INDEX, wire.SNAPSHOT_KEEP, wire.SNAPSHOT_BASE_INDEX,
              wire.FRAGMENT_INDEX, wire.FRAGMENT_COUNT, wire.MAX_SNAPSHOTS, wire.TOOL_CALL_ID]  # fmt: skip
HOSTILE_RUNS = ["h-0", "h-1", "h-2", "h-3"]
"""The run ids plausible hostile records share, so they collide: forged keys, taken ids, parent cycles."""
KNOWN_MEDIA = bytes(range(256)) * 4
"""A blob a stored message refers to (tests/test_hostile_queries.py `seed`), so media fuzzing has a URI to serve."""
KNOWN_MEDIA_URI = URI_PREFIX + hashlib.sha256(KNOWN_MEDIA).hexdigest()
KNOWN_MEDIA_MESSAGE = json.dumps({"kind": "request", "parts": [{"part_kind": "user-prompt", "content": [
    {"kind": "binary", "data": base64.b64encode(KNOWN_MEDIA).decode(), "media_type": "image/png"}]}]})  # fmt: skip

# -- any OTLP value or record, well-typed or not -------------------------------------------------------------------

scalars = st.one_of(
    st.builds(lambda v: AnyValue(string_value=v), st.text(max_size=40)),
    st.builds(lambda v: AnyValue(int_value=v), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    st.builds(lambda v: AnyValue(double_value=v), st.floats(allow_nan=True)),
    st.builds(lambda v: AnyValue(bool_value=v), st.booleans()),
    st.builds(lambda v: AnyValue(bytes_value=v), st.binary(max_size=64)),
)
any_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.builds(lambda vs: AnyValue(array_value=ArrayValue(values=vs)), st.lists(inner, max_size=4)),
        st.builds(
            lambda kvs: AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=v) for k, v in kvs])),
            st.lists(st.tuples(st.sampled_from([*KNOWN_KEYS, wire.BODY_MESSAGES, "x"]), inner), max_size=4),
        ),
    ),
    max_leaves=30,
)
attributes = st.one_of(
    st.lists(
        st.builds(
            lambda k, v: KeyValue(key=k, value=v),
            st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=20)),
            any_values,
        ),  # fmt: skip
        max_size=12,
    ),
    # Huge attribute counts, built in one go: a list strategy of thousands would be slow to draw.
    st.integers(min_value=100, max_value=3000).map(
        lambda n: [KeyValue(key=f"k{i}", value=AnyValue(int_value=i)) for i in range(n)]
    ),
)
records = st.builds(
    lambda name, attrs, body, t: LogRecord(event_name=name, attributes=attrs, body=body, time_unix_nano=t),
    st.one_of(st.sampled_from(KNOWN_NAMES), st.text(max_size=30)),
    attributes,
    any_values,
    st.integers(min_value=0, max_value=2**64 - 1),
)

# -- plausible steprec records: the wire format's fields, each right, borderline or of the wrong type -----------


def string_value(text: str) -> AnyValue:
    return AnyValue(string_value=text)


def int_value(number: int) -> AnyValue:
    return AnyValue(int_value=number)


def _kvlist(items: dict[str, AnyValue]) -> AnyValue:
    return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=v) for k, v in items.items()]))


def log_record(name: str, attrs: dict[str, AnyValue], body: AnyValue | None = None, **fields: object) -> LogRecord:
    return LogRecord(event_name=name, attributes=[KeyValue(key=k, value=v) for k, v in attrs.items()], body=body,
                     time_unix_nano=fields.pop("time_unix_nano", 1), **fields)  # fmt: skip


run_id_texts = st.one_of(
    st.sampled_from(HOSTILE_RUNS),
    st.sampled_from(["..", "a..b", "../../etc/passwd", "a/b", "", " h-0", "h-0\n", "x" * 201, "\x00", "Ωmega"]),
    st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True),
    st.text(max_size=30),
)
edge_ints = st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1),
                      st.sampled_from([-1, 2**31 - 1, 2**31, -(2**31) - 1, 2**63 - 1]))  # fmt: skip
idempotency_keys = st.sampled_from(["0:0:run_started:", "1:0:run_completed:", "0:0:complete", "1:1:interrupted",
                                    "0:c1:started", "fragment:0"])  # fmt: skip
_TEXT = st.text(max_size=20).map(string_value)
_RUNS = st.sampled_from(HOSTILE_RUNS).map(string_value)
FIELDS = {
    wire.RUN_ID: (_RUNS, run_id_texts),
    wire.STEP_INDEX: (st.integers(0, 5), edge_ints),
    wire.PARENT_RUN_ID: (_RUNS, run_id_texts),
    wire.CONVERSATION_ID: (_TEXT, st.just("c" * (64 * 1024 + 1))),
    wire.AGENT_NAME: (_TEXT, st.just("a" * (64 * 1024 + 1))),
    wire.IDEMPOTENCY_KEY: (idempotency_keys.map(string_value), st.text(max_size=20)),
    wire.REGISTRATION_ID: (st.sampled_from(["reg-a", "reg-b"]).map(string_value), st.just("")),
    wire.MAX_SNAPSHOTS: (st.integers(1, 3), edge_ints),
    wire.FORKED_FROM_RUN_ID: (_RUNS, run_id_texts),
    wire.FORKED_FROM_SNAPSHOT: (st.integers(0, 4), edge_ints),
    wire.TOOL_CALL_ID: (st.sampled_from(["c1", "c2"]).map(string_value), st.just("")),
    wire.TOOL_NAME: (_TEXT, st.just("t" * (64 * 1024 + 1))),
    wire.ERROR_TYPE: (_TEXT, st.text(max_size=3)),
    wire.ERROR_MESSAGE: (_TEXT, st.just("e" * (64 * 1024 + 1))),
    wire.SNAPSHOT_INDEX: (st.integers(0, 4), edge_ints),
    wire.SNAPSHOT_STATE: (st.sampled_from(wire.SNAPSHOT_STATES).map(string_value), st.sampled_from(["done", ""])),
    wire.SNAPSHOT_BASE_INDEX: (st.integers(0, 4), edge_ints),
    wire.SNAPSHOT_KEEP: (st.integers(0, 4), edge_ints),
    wire.EFFECT_STATUS: (st.sampled_from(wire.EFFECT_STATUSES).map(string_value), st.sampled_from(["done", ""])),
    wire.FRAGMENT_DIGEST: (st.binary(min_size=32, max_size=32).map(bytes.hex), st.text(max_size=70)),
    wire.FRAGMENT_INDEX: (st.integers(0, 3), edge_ints),
    wire.FRAGMENT_COUNT: (st.integers(1, 4), edge_ints),
}
"""Per attribute: right values (sharing a few run ids, keys and registrations, so records collide), and edge
values of the right type (bad run ids, out-of-range numbers, over-long text). Plain ints and strings are
wrapped as AnyValue where drawn."""
LINEAGE = [wire.RUN_ID, wire.STEP_INDEX]
OPTIONAL_LINEAGE = [wire.PARENT_RUN_ID, wire.CONVERSATION_ID, wire.AGENT_NAME, wire.IDEMPOTENCY_KEY]
KIND_FIELDS = {
    "event": (
        [],
        [
            wire.REGISTRATION_ID,
            wire.MAX_SNAPSHOTS,
            wire.FORKED_FROM_RUN_ID,
            wire.FORKED_FROM_SNAPSHOT,
            wire.TOOL_CALL_ID,
            wire.TOOL_NAME,
            wire.ERROR_TYPE,
            wire.ERROR_MESSAGE,
        ],
    ),
    wire.EVENT_PREFIX + "run_started": (
        [wire.REGISTRATION_ID],
        [wire.MAX_SNAPSHOTS, wire.FORKED_FROM_RUN_ID, wire.FORKED_FROM_SNAPSHOT],
    ),
    wire.SNAPSHOT: ([wire.SNAPSHOT_INDEX, wire.SNAPSHOT_STATE, wire.SNAPSHOT_KEEP], [wire.SNAPSHOT_BASE_INDEX]),
    wire.TOOL_EFFECT: ([wire.EFFECT_STATUS, wire.TOOL_CALL_ID, wire.TOOL_NAME], [wire.ERROR_MESSAGE]),
    wire.MESSAGE_FRAGMENT: ([wire.FRAGMENT_DIGEST, wire.FRAGMENT_INDEX, wire.FRAGMENT_COUNT], []),
}
"""Per kind: the attributes it requires, and those it may carry (besides the lineage every record has)."""


def _any_value(value: object) -> AnyValue:
    if isinstance(value, AnyValue):
        return value
    return int_value(value) if isinstance(value, int) else string_value(value)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
message_texts = st.one_of(
    st.dictionaries(st.text(max_size=8), json_values, max_size=5).map(json.dumps),
    # The shapes media offload acts on, and forged markers it must never honour.
    st.builds(
        lambda data: json.dumps({"kind": "binary", "data": data, "media_type": "image/png"}),
        st.one_of(st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode()), st.text(max_size=12)),
    ),
    st.builds(
        lambda uri, field: json.dumps({"parts": [{MARKER: {"uri": uri, "field": field, "encoding": "std"}}]}),
        st.sampled_from([KNOWN_MEDIA_URI, "/etc/passwd", URI_PREFIX + "../../etc/passwd"]),
        st.text(max_size=8),
    ),
    st.builds(lambda inner: json.dumps({LITERAL: inner}), json_values),
    st.just('{"__steprec_medi\\u0061__": {"uri": "/etc/passwd", "field": "data", "encoding": "utf-8"}}'),
    st.sampled_from(['{"kind": "binary", "data": "AAAA", "x": "\\ud800"}', '{"x": "\\u0000\\udfff"}']),
    st.builds(lambda n: json.dumps({"part_kind": "text", "content": "x" * n}), st.integers(60_000, 70_000)),
    st.text(max_size=30),  # not JSON, or JSON but not an object
)


POOL_MESSAGES = [json.dumps({"kind": "request", "parts": [], "n": n}) for n in range(4)]
"""Messages many snapshots share: a reference to one resolves only if some earlier snapshot carried it."""


def _snapshot_body(refs: bytes, messages: list[str]) -> dict[str, AnyValue]:
    listed = AnyValue(array_value=ArrayValue(values=[string_value(m) for m in messages]))
    return {wire.BODY_APPEND_REFS: AnyValue(bytes_value=refs), wire.BODY_MESSAGES: listed}


@st.composite
def _body(draw: st.DrawFn, kind: str) -> AnyValue:
    """A body of the kind's shape: snapshot refs that resolve (or not), fragment bytes, effect notes, metadata."""
    if kind == wire.SNAPSHOT:
        messages = draw(st.lists(st.one_of(message_texts, st.sampled_from(POOL_MESSAGES)), max_size=3))
        known = [hashlib.sha256(m.encode()).digest() for m in [*messages, *POOL_MESSAGES]]
        refs = draw(st.lists(st.one_of(st.sampled_from(known), st.binary(min_size=32, max_size=32)), max_size=4))
        items = _snapshot_body(b"".join(refs), messages)
    elif kind == wire.MESSAGE_FRAGMENT:
        items = {wire.BODY_FRAGMENT_DATA: AnyValue(bytes_value=draw(st.binary(max_size=64)))}
    elif kind == wire.TOOL_EFFECT:
        items = {wire.BODY_EFFECT_IDEMPOTENCY_KEY: string_value(draw(st.text(max_size=10))),
                 wire.BODY_EFFECT_SUMMARY: string_value(draw(st.text(max_size=30)))}  # fmt: skip
    else:
        items = {wire.BODY_METADATA: _kvlist({k: string_value(v) for k, v in draw(
            st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)).items()})}  # fmt: skip
    return _kvlist(items)


NEAR_MISSES = ["steprec.event.nope", "steprec.snapshots", "steprec.event.", ""]


@st.composite
def steprec_records(draw: st.DrawFn) -> LogRecord:
    """A record of a known kind (or a near miss of one) with right values, then up to two things spoiled: an
    attribute dropped, of the wrong type or at an edge value, the body replaced, or the time past 2262."""
    name = draw(st.sampled_from([*KNOWN_NAMES, *NEAR_MISSES]))
    kind = name if name in KIND_FIELDS else "event"
    required, optional = KIND_FIELDS[kind]
    names = [
        *LINEAGE,
        *required,
        *draw(st.lists(st.sampled_from(OPTIONAL_LINEAGE + optional), unique=True, max_size=4)),
    ]
    fields = {key: _any_value(draw(FIELDS[key][0])) for key in names}
    body, when = draw(_body(kind)), draw(st.integers(1, 2**62))
    for _ in range(draw(st.integers(0, 2))):
        how = draw(st.sampled_from(["drop", "retype", "edge", "edge", "body", "time"]))
        key = draw(st.sampled_from(sorted({*LINEAGE, *OPTIONAL_LINEAGE, *required, *optional})))
        if how == "drop":
            fields.pop(key, None)
        elif how == "retype":
            fields[key] = draw(any_values)
        elif how == "edge":
            fields[key] = _any_value(draw(FIELDS[key][1]))
        elif how == "body":
            body = draw(any_values)
        else:
            when = draw(st.sampled_from([0, 2**63 - 1, 2**63, 2**64 - 1]))
    trace = {"trace_id": draw(st.binary(max_size=20)), "span_id": draw(st.binary(max_size=10))}
    return log_record(name, fields, body, time_unix_nano=when, **trace)


def fragment(run_id: str, digest: str, index: int, count: int, data: bytes) -> LogRecord:
    """Piece `index` of `count` of the message whose hex SHA-256 is `digest`."""
    attrs = {wire.RUN_ID: string_value(run_id), wire.STEP_INDEX: int_value(0),
             wire.FRAGMENT_DIGEST: string_value(digest), wire.FRAGMENT_INDEX: int_value(index),
             wire.FRAGMENT_COUNT: int_value(count),
             wire.IDEMPOTENCY_KEY: string_value(f"fragment:{digest}:{index}")}  # fmt: skip
    return log_record(wire.MESSAGE_FRAGMENT, attrs, _kvlist({wire.BODY_FRAGMENT_DATA: AnyValue(bytes_value=data)}))


@st.composite
def fragment_series(draw: st.DrawFn) -> list[LogRecord]:
    """A message in fragments as the exporter sends it, then spoiled: pieces lost, repeated, reordered or altered."""
    whole = json.dumps({"kind": "request", "parts": [{"part_kind": "text", "content": draw(st.text(max_size=50))}]})
    data = whole.encode() if draw(st.booleans()) else draw(st.binary(min_size=1, max_size=80))
    digest = hashlib.sha256(data).hexdigest()
    count = draw(st.integers(1, 4))
    size = -(-len(data) // count)
    pieces = [data[i * size : (i + 1) * size] or b"x" for i in range(count)]
    order = draw(st.permutations(range(count)))
    order = draw(st.lists(st.sampled_from(order), max_size=count + 2)) if draw(st.booleans()) else order
    run_id = draw(st.sampled_from(HOSTILE_RUNS))

    return [fragment(run_id, digest, index, count, pieces[index]) for index in order]


EDGE_VALUES = [AnyValue(), AnyValue(int_value=-1), AnyValue(int_value=2**31), AnyValue(int_value=-(2**63)),
               string_value(""), string_value(".."), string_value("x" * 201), AnyValue(double_value=float("nan")),
               AnyValue(bytes_value=b"\x00" * 33), AnyValue(bool_value=True), string_value("h-0")]  # fmt: skip


def mutate(record: LogRecord, rng: random.Random) -> LogRecord:
    """A copy of `record` with one to three cheap changes: an attribute dropped, added (perhaps a second one of
    the same key), set to an edge value or to another shared run id; the event name, the time or a body
    value changed. hypothesis draws a record in milliseconds, this takes microseconds: the long run sends
    several mutants of each drawn record to reach its count."""
    out = LogRecord()
    out.CopyFrom(record)
    attrs = out.attributes
    for _ in range(rng.randint(1, 3)):
        how = rng.randrange(7)
        if how == 0 and attrs:
            del attrs[rng.randrange(len(attrs))]
        elif how == 1 and attrs:
            attrs[rng.randrange(len(attrs))].value.CopyFrom(rng.choice(EDGE_VALUES))
        elif how == 2:
            attrs.add(key=rng.choice(list(FIELDS)), value=rng.choice(EDGE_VALUES))
        elif how == 3:
            out.event_name = rng.choice([*KNOWN_NAMES, *NEAR_MISSES])
        elif how == 4:
            for kv in attrs:
                if kv.key in (wire.RUN_ID, wire.PARENT_RUN_ID, wire.FORKED_FROM_RUN_ID):
                    kv.value.CopyFrom(string_value(rng.choice(HOSTILE_RUNS)))
        elif how == 5:
            out.time_unix_nano = rng.choice([0, 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1])
        elif out.body.kvlist_value.values:
            kv = rng.choice(out.body.kvlist_value.values)
            if kv.value.HasField("bytes_value") and kv.value.bytes_value:
                cut = rng.randrange(len(kv.value.bytes_value))
                kv.value.bytes_value = kv.value.bytes_value[:cut] + bytes([rng.randrange(256)])
            else:
                kv.value.CopyFrom(rng.choice(EDGE_VALUES))
    return out


def hostile_batches(max_groups: int = 12, mutants: int = 1) -> st.SearchStrategy[list[LogRecord]]:
    """Hostile records for one request: any records, plausible steprec records and fragment series, each drawn
    record followed by up to `mutants` mutations of it."""
    groups = st.one_of(records.map(lambda r: [r]), steprec_records().map(lambda r: [r]), fragment_series())

    def amplified(drawn: list[list[LogRecord]], seed: int) -> list[LogRecord]:
        rng = random.Random(seed)
        return [out for group in drawn for record in group
                for out in [record, *(mutate(record, rng) for _ in range(rng.randint(0, mutants)))]]  # fmt: skip

    return st.builds(amplified, st.lists(groups, max_size=max_groups), st.integers(0, 2**32))


# -- hostile request bytes -------------------------------------------------------------------------------------


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field, by hand: the Python protobuf runtime refuses to build
    nesting as deep as a hostile peer can send, or strings that are not UTF-8."""
    length, encoded = len(payload), bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        encoded.append(byte | (0x80 if length else 0))
        if not length:
            return bytes([number << 3 | 2]) + bytes(encoded) + payload


def request_bytes(*records: LogRecord) -> bytes:
    return logs_service_pb2.ExportLogsServiceRequest(
        resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=records)])]
    ).SerializeToString()


@functools.lru_cache(maxsize=256)
def nested_request(depth: int, kvlist: bool) -> bytes:
    """A snapshot whose body is `depth` levels of arrays (or key-value lists) deep, inside a whole request."""
    value = AnyValue(string_value="leaf").SerializeToString()
    for _ in range(depth):  # AnyValue.array_value (5) -> ArrayValue.values (1) -> AnyValue ...
        value = _field(6, _field(1, _field(2, value))) if kvlist else _field(5, _field(1, value))
    deep = LogRecord(event_name=wire.SNAPSHOT, time_unix_nano=1).SerializeToString() + _field(5, value)
    return _field(1, _field(2, _field(2, deep)))  # ResourceLogs.scope_logs.log_records


_PLACEHOLDER = "\x01steprec-utf8\x01"


def invalid_utf8_request(record: LogRecord, junk: bytes, where: str) -> bytes:
    """`record` in a request, with one of its strings replaced by bytes that are not UTF-8 (same length)."""
    junk = (b"\xc3\x28" + junk + b"\xff" * len(_PLACEHOLDER))[: len(_PLACEHOLDER)]
    spoiled = LogRecord()
    spoiled.CopyFrom(record)
    if where == "event_name":
        spoiled.event_name = _PLACEHOLDER
    else:
        spoiled.attributes.add(
            key=_PLACEHOLDER if where == "key" else wire.AGENT_NAME, value=string_value(_PLACEHOLDER)
        )
    return request_bytes(spoiled).replace(_PLACEHOLDER.encode(), junk, 1)


raw_requests = st.one_of(
    st.binary(max_size=4096),
    st.builds(nested_request, st.one_of(st.integers(1, 120), st.sampled_from([500, 1000, 3000])), st.booleans()),
    st.builds(
        invalid_utf8_request, steprec_records(), st.binary(max_size=16), st.sampled_from(["event_name", "key", "value"])
    ),  # fmt: skip
    # A valid request cut short (often still valid protobuf), or followed by junk.
    st.builds(lambda rs, cut: request_bytes(*rs)[:cut], hostile_batches(4), st.integers(0, 4000)),
    st.builds(lambda rs, junk: request_bytes(*rs) + junk, hostile_batches(4), st.binary(min_size=1, max_size=64)),
)
"""Whole Export payloads that are not (or not quite) an OTLP request."""

# -- sending, and judging what came back -------------------------------------------------------------------------


@dataclass
class Answer:
    """How the recorder answered one input: a gRPC status, refusal codes, and what was wrong with it, if anything."""

    status: str
    refusals: Counter[str] = field(default_factory=Counter)
    problem: str | None = None


def status_of(error: grpc.RpcError) -> Answer:
    """A gRPC error as an Answer: a clear status is fine, UNKNOWN/INTERNAL/UNAVAILABLE, a traceback or no answer
    before the deadline (a SQL time limit says "time limit") is a problem."""
    code, details = error.code(), error.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and "time limit" not in details:
        return Answer("HANG", problem=f"no answer within {DEADLINE:g} s")
    if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE):
        return Answer(code.name, problem=f"{code.name}: {details[:300]}")
    if "Traceback" in details or not details.strip():
        return Answer(code.name, problem=f"{code.name} without a clear reason: {details[:300]!r}")
    return Answer(code.name)


def export(
    channel: grpc.Channel, payload: bytes, timeout: float = DEADLINE
) -> tuple[Answer, logs_service_pb2.ExportLogsServiceResponse]:
    """Send Export bytes; a whole request may only be refused with INVALID_ARGUMENT (unreadable payloads)."""
    try:
        raw = channel.unary_unary(EXPORT)(payload, timeout=timeout)
    except grpc.RpcError as error:
        answer = status_of(error)
        if answer.problem is None and answer.status != "INVALID_ARGUMENT":
            answer.problem = f"an Export refused with {answer.status}: {error.details()[:200]}"
        return answer, logs_service_pb2.ExportLogsServiceResponse()
    response = logs_service_pb2.ExportLogsServiceResponse.FromString(raw)
    lines = response.partial_success.error_message.splitlines()
    answer = Answer("OK")
    for line in lines:
        code = line.partition("[")[2].partition("]")[0]
        if line.startswith("record ") and "]: " in line and code in REFUSAL_CODES:
            answer.refusals[code] += 1
        elif not line.startswith("... and "):
            answer.problem = f"a refusal line not in the documented form: {line[:200]!r}"
    counted = response.partial_success.rejected_log_records
    if counted != len(lines) and not (counted > 100 and lines[-1] == f"... and {counted - 100} more"):
        answer.problem = f"{counted} records refused but {len(lines)} lines say why"
    return answer, response


def run_completed(run_id: str) -> LogRecord:
    return log_record(
        wire.EVENT_PREFIX + "run_completed", {wire.RUN_ID: string_value(run_id), wire.STEP_INDEX: int_value(0)}
    )


def snapshot_of(run_id: str, *messages: str, index: int = 0, base: int | None = None, keep: int = 0) -> LogRecord:
    """A complete snapshot holding `messages` after the first `keep` of snapshot `base` (a full one by default)."""
    attrs = {wire.RUN_ID: string_value(run_id), wire.STEP_INDEX: int_value(0), wire.SNAPSHOT_INDEX: int_value(index),
             wire.SNAPSHOT_STATE: string_value("complete"), wire.SNAPSHOT_KEEP: int_value(keep)}  # fmt: skip
    if base is not None:
        attrs[wire.SNAPSHOT_BASE_INDEX] = int_value(base)
    refs = b"".join(hashlib.sha256(message.encode()).digest() for message in messages)
    return log_record(wire.SNAPSHOT, attrs, _kvlist(_snapshot_body(refs, list(messages))))


class GoodRecords:
    """Well-formed records sent among hostile ones, which must all be stored: one run_completed event per run,
    under run ids no generator can produce (`prefix`)."""

    def __init__(self) -> None:
        self.prefix = f"good-{uuid.uuid4().hex[:12]}-"
        self._serial = itertools.count()
        self.run_ids: list[str] = []

    def make(self) -> LogRecord:
        self.run_ids.append(f"{self.prefix}{next(self._serial)}")
        return run_completed(self.run_ids[-1])

    def stored(self, endpoint: str) -> int:
        """How many of the good runs the recorder reads back (through SQL, which sees every acknowledged record)."""
        with SyncRecorderClient(endpoint) as client:
            table = client.sql(
                f"SELECT count(DISTINCT run_id) AS n FROM events WHERE starts_with(run_id, '{self.prefix}')"
                " AND kind = 'run_completed'"
            )
        return table.column("n")[0].as_py()


REQUEST_BYTES = 3 << 20
"""Hostile records go in requests of at most about this size, under gRPC's 4 MiB cap."""


def export_beside_good(channel: grpc.Channel, bad: list[LogRecord], good: GoodRecords, every: int = 4) -> Answer:
    """Export `bad` with a good record after every `every` of them (in as many requests as the size cap needs);
    the good ones must be acknowledged unrefused (whether they were stored is read back later)."""
    answer, batch, good_at, size = Answer("OK"), [], set(), 0
    for position, record in enumerate([*bad, None]):
        if record is not None:
            batch.append(record)
            size += record.ByteSize()
        if record is None or position % every == every - 1:
            good_at.add(len(batch))
            batch.append(good.make())
        if record is None or size > REQUEST_BYTES:
            _merge(answer, _export_with_good(channel, batch, good_at))
            batch, good_at, size = [], set(), 0
    return answer


def _export_with_good(channel: grpc.Channel, batch: list[LogRecord], good_at: set[int]) -> Answer:
    answer, response = export(channel, request_bytes(*batch))
    if answer.status != "OK" and answer.problem is None:
        answer.problem = f"a request of well-formed protobuf refused whole with {answer.status}"
    for line in response.partial_success.error_message.splitlines():
        if line.startswith("record ") and int(line.split()[1]) in good_at:
            answer.problem = f"a good record was refused: {line[:200]}"
    return answer


def _merge(total: Answer, part: Answer) -> None:
    total.status = total.status if part.status == "OK" else part.status
    total.refusals.update(part.refusals)
    total.problem = total.problem or part.problem


def is_serving(endpoint: str) -> bool:
    """The recorder answers its health check, SERVING."""
    with grpc.insecure_channel(endpoint) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


# -- journal segments: what a recorder adopting a folder reads from disk -----------------------------------------


@dataclass(frozen=True)
class HostileSegment:
    """A journal segment a stranger planted: frames of hostile or unreadable requests after one good frame, bytes
    after the last frame, a byte flipped somewhere after the good frame, and any `.pos` text."""

    frames: list[bytes]
    tail: bytes
    flip: int | None
    position: str | None

    def inputs(self) -> int:
        return len(self.frames) + bool(self.tail) + (self.flip is not None) + (self.position is not None)


hostile_segments = st.builds(
    HostileSegment,
    st.lists(st.one_of(hostile_batches(4).map(lambda records: request_bytes(*records)), raw_requests), max_size=5),
    st.one_of(st.just(b""), st.binary(min_size=1, max_size=64), raw_requests.map(lambda r: encode_frame(9, r)[:-1])),
    st.none() | st.integers(0, 1 << 20),
    st.none() | st.text(max_size=12) | st.integers(-5, 1 << 40).map(str),
)


def adopt_segments(folder: Path, segments: list[HostileSegment], good: GoodRecords) -> Answer:
    """Plant `segments` in a folder the recorder adopts, each starting with a frame of one good record, and wait
    until the recorder took every one (adopted, or set aside in rejected/). A segment still there after the
    deadline is a hang; one set aside whose good frame was not stored shows when `good` is read back."""
    planted = []
    for segment in segments:
        good_frame = encode_frame(0, request_bytes(good.make()))
        data = bytearray(good_frame + b"".join(encode_frame(n, f) for n, f in enumerate(segment.frames, 1)))
        data += segment.tail
        if segment.flip is not None and len(data) > len(good_frame):
            data[len(good_frame) + segment.flip % (len(data) - len(good_frame))] ^= 0xFF
        path = folder / f"journal-0-{uuid.uuid4().hex}.log"
        if segment.position is not None:
            path.with_suffix(".pos").write_text(segment.position)
        scratch = path.with_suffix(".planting")  # whole before the recorder sees it, as an agent's locked one is
        scratch.write_bytes(data)
        if segment.position in {str(end) for _, end, _ in read_frames(scratch)}:
            good.run_ids.pop()  # the .pos says the good frame was acknowledged already: it is not sent again
        scratch.rename(path)
        planted.append(path)
    deadline = time.monotonic() + DEADLINE
    while any(path.exists() for path in planted):
        if time.monotonic() > deadline:
            return Answer("HANG", problem=f"segments not adopted within {DEADLINE:g} s")
        time.sleep(0.05)
    rejected = folder / "rejected"
    aside = sum((rejected / path.name).exists() for path in planted)
    return Answer("OK", Counter({"set aside": aside, "adopted": len(planted) - aside}))


# -- the fast tests ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RecorderProcess, grpc.Channel]]:
    """One recorder for every generated input of a module; each must leave it serving the next."""
    recorder = RecorderProcess(Path(tmp_path_factory.mktemp("hostile")) / "recorder").start()
    channel = grpc.insecure_channel(recorder.endpoint)
    try:
        yield recorder, channel
        assert recorder.process.poll() is None and is_serving(recorder.endpoint)
    finally:
        channel.close()
        recorder.stop()


FAST = settings(max_examples=100, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip


@pytest.fixture(scope="module")
def adopting_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RecorderProcess, Path]]:
    """One recorder adopting one journal folder, for every generated segment of a module."""
    folder = Path(tmp_path_factory.mktemp("adopting"))
    journal = folder / "journal"
    journal.mkdir(mode=0o700)
    recorder = RecorderProcess(folder / "recorder", extra_args=("--adopt-journals", str(journal))).start()
    try:
        yield recorder, journal
        assert recorder.process.poll() is None and is_serving(recorder.endpoint)
        assert "Traceback" not in recorder.log_path.read_text(errors="replace")
    finally:
        recorder.stop()


@settings(FAST, max_examples=15)
@given(segments=st.lists(hostile_segments, min_size=1, max_size=4))
def test_planted_journal_segments_are_adopted_or_set_aside_and_their_good_frames_stored(
    adopting_target, segments: list[HostileSegment]
) -> None:
    recorder, folder = adopting_target
    good = GoodRecords()
    answer = adopt_segments(folder, segments, good)
    assert answer.problem is None, answer
    assert good.stored(recorder.endpoint) == len(good.run_ids)
    assert recorder.process.poll() is None


@FAST
@given(bad=hostile_batches())
def test_generated_records_are_refused_or_stored_and_good_ones_beside_them_stored(hostile_target, bad) -> None:
    recorder, channel = hostile_target
    good = GoodRecords()
    answer = export_beside_good(channel, bad, good)
    assert answer.problem is None, answer
    assert good.stored(recorder.endpoint) == len(good.run_ids)
    assert recorder.process.poll() is None


@FAST
@given(payload=raw_requests)
def test_unreadable_requests_get_a_status_never_a_crash(hostile_target, payload: bytes) -> None:
    recorder, channel = hostile_target
    answer, _ = export(channel, payload)
    assert answer.problem is None, answer
    assert recorder.process.poll() is None


def test_deeply_nested_values_are_refused_not_fatal(hostile_target) -> None:
    recorder, channel = hostile_target
    good = GoodRecords()
    # Past protobuf's nesting limit the whole request is unreadable: refused with the reason ...
    with pytest.raises(grpc.RpcError) as refused:
        channel.unary_unary(EXPORT)(request_bytes(good.make()) + nested_request(500, False), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not an OTLP" in refused.value.details()
    # ... and a good record in a request of its own is stored: the recorder kept serving.
    good.run_ids.clear()
    assert export_beside_good(channel, [], good).problem is None
    assert good.stored(recorder.endpoint) == 1


def test_a_time_past_2262_is_refused_not_acknowledged_and_stalling_the_store(hostile_target) -> None:
    """OTLP times are unsigned; DuckDB's are signed. One acknowledged but unstorable time once stalled every
    record after it (the applier retried it forever), so the good records beside it were never readable."""
    recorder, channel = hostile_target
    good = GoodRecords()
    late = run_completed(f"{good.prefix}late")
    late.time_unix_nano = 2**63
    answer = export_beside_good(channel, [late], good)
    assert answer.refusals == {"bad_attribute": 1} and answer.problem is None
    assert good.stored(recorder.endpoint) == 1  # the good one, not the late one


def test_a_lone_surrogate_in_offloaded_media_json_is_stored_and_read_back(hostile_target) -> None:
    """`"\\ud800"` is valid JSON but not Unicode: media offload once rewrote it as raw text that could not be
    encoded, so DuckDB set the whole request aside, good records with it, and reads of the message failed."""
    recorder, channel = hostile_target
    good = GoodRecords()
    message = '{"kind": "binary", "data": "AAAA", "x": "\\ud800"}'
    assert export_beside_good(channel, [snapshot_of(f"{good.prefix}s", message)], good).problem is None
    assert good.stored(recorder.endpoint) == 1  # the good record beside it
    with SyncRecorderClient(recorder.endpoint) as client:
        table = client.sql(f"SELECT message FROM snapshot_messages WHERE run_id = '{good.prefix}s'")
    assert json.loads(table.column("message")[0].as_py())["x"] == "\ud800"


def test_snapshot_bases_in_a_cycle_do_not_stall_ingest(tmp_path: Path) -> None:
    """Snapshot 1 claims base 1 (itself), accepted as nothing of it is stored yet; a later snapshot on base 1 then
    walks 1 -> 1 -> ... A recorder of its own, killed after: the loop never ends."""
    recorder = RecorderProcess(tmp_path / "recorder").start()
    try:
        with grpc.insecure_channel(recorder.endpoint) as channel:
            for index, base in ((0, None), (1, 1), (2, 1)):
                assert export(channel, request_bytes(snapshot_of("cycle", index=index, base=base)))[0].problem is None
            answer, _ = export(channel, request_bytes(snapshot_of("cycle", index=3, base=1)), timeout=5)
            assert answer.problem is None, answer
            good = GoodRecords()
            assert export_beside_good(channel, [], good).problem is None
    finally:
        recorder.kill()


def test_fragments_of_one_message_with_different_counts_are_refused_not_fatal(hostile_target) -> None:
    recorder, channel = hostile_target
    good, digest = GoodRecords(), hashlib.sha256(b"never whole").hexdigest()
    pieces = [fragment("frag-counts", digest, index, count, b"x") for index, count in ((2, 6), (5, 6), (0, 2))]
    answer = export_beside_good(channel, pieces, good)
    assert answer.problem is None and answer.refusals == {"bad_attribute": 1}, answer
    assert good.stored(recorder.endpoint) == 1
