"""Generated hostile OTLP input against a real recorder: it never crashes or hangs, and good records sent
alongside are stored. A fast version for the normal suite (issue 6 asks for a long run beside it)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from steprec.proto import wire
from steprec.query import SyncRecorderClient
from steprec.recorder.process import RecorderProcess

EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
KNOWN_NAMES = [wire.EVENT_PREFIX + "run_started", wire.EVENT_PREFIX + "tool_call_started", wire.SNAPSHOT,
               wire.TOOL_EFFECT, wire.MESSAGE_FRAGMENT]  # fmt: skip
KNOWN_KEYS = [wire.RUN_ID, wire.STEP_INDEX, wire.SNAPSHOT_INDEX, wire.SNAPSHOT_KEEP, wire.SNAPSHOT_BASE_INDEX,
              wire.FRAGMENT_INDEX, wire.FRAGMENT_COUNT, wire.MAX_SNAPSHOTS, wire.TOOL_CALL_ID]  # fmt: skip

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
attributes = st.lists(
    st.builds(
        lambda k, v: KeyValue(key=k, value=v), st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=20)), any_values
    ),  # fmt: skip
    max_size=12,
)
records = st.builds(
    lambda name, attrs, body, t: LogRecord(event_name=name, attributes=attrs, body=body, time_unix_nano=t),
    st.one_of(st.sampled_from(KNOWN_NAMES), st.text(max_size=30)),
    attributes,
    any_values,
    st.integers(min_value=0, max_value=2**64 - 1),
)

_serial = itertools.count()


def _good() -> tuple[str, LogRecord]:
    run_id = f"good-{next(_serial)}"
    attrs = [KeyValue(key=wire.RUN_ID, value=AnyValue(string_value=run_id)),
             KeyValue(key=wire.STEP_INDEX, value=AnyValue(int_value=0))]  # fmt: skip
    return run_id, LogRecord(event_name=wire.EVENT_PREFIX + "run_completed", attributes=attrs, time_unix_nano=1)


@pytest.fixture(scope="module")
def hostile_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RecorderProcess, grpc.Channel]]:
    recorder = RecorderProcess(Path(tmp_path_factory.mktemp("hostile")) / "recorder").start()
    channel = grpc.insecure_channel(recorder.endpoint)
    try:
        yield recorder, channel
    finally:
        channel.close()
        recorder.stop()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=st.lists(records, min_size=1, max_size=6))
def test_generated_records_are_refused_or_stored_and_good_ones_beside_them_stored(hostile_target, bad) -> None:
    recorder, channel = hostile_target
    run_id, good = _good()
    request = logs_service_pb2.ExportLogsServiceRequest(
        resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=[*bad, good])])]
    )
    response = logs_service_pb2_grpc.LogsServiceStub(channel).Export(request, timeout=30)
    refusals = response.partial_success.error_message.splitlines()
    assert response.partial_success.rejected_log_records == len(refusals)
    assert all(line.startswith("record ") and "]: " in line for line in refusals), refusals
    assert not any(line.startswith(f"record {len(bad)} ") for line in refusals)  # the good record
    with SyncRecorderClient(recorder.endpoint) as client:
        assert [e.kind for e in client.list_events(run_id)] == ["run_completed"]
    assert recorder.process.poll() is None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(max_size=4096))
def test_random_bytes_get_a_status_never_a_crash(hostile_target, garbage: bytes) -> None:
    recorder, channel = hostile_target
    try:
        channel.unary_unary(EXPORT)(garbage, timeout=30)
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert recorder.process.poll() is None


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field, by hand: the Python protobuf runtime refuses to build
    nesting as deep as a hostile peer can send."""
    length, encoded = len(payload), bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        encoded.append(byte | (0x80 if length else 0))
        if not length:
            return bytes([number << 3 | 2]) + bytes(encoded) + payload


def test_deeply_nested_values_are_refused_not_fatal(hostile_target) -> None:
    recorder, channel = hostile_target
    value = AnyValue(string_value="leaf").SerializeToString()
    for _ in range(500):  # AnyValue.array_value (5) -> ArrayValue.values (1) -> AnyValue ...
        value = _field(5, _field(1, value))
    deep = LogRecord(event_name=wire.SNAPSHOT, time_unix_nano=1).SerializeToString() + _field(5, value)
    run_id, good = _good()
    request = logs_service_pb2.ExportLogsServiceRequest(
        resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=[good])])]
    ).SerializeToString() + _field(1, _field(2, _field(2, deep)))  # a second ResourceLogs holding it
    # Past protobuf's nesting limit the whole request is unreadable: refused with the reason ...
    with pytest.raises(grpc.RpcError) as refused:
        channel.unary_unary(EXPORT)(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not an OTLP" in refused.value.details()
    # ... and the same good record in a request of its own is stored: the recorder kept serving.
    logs_service_pb2_grpc.LogsServiceStub(channel).Export(
        logs_service_pb2.ExportLogsServiceRequest(
            resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=[good])])]
        ),
        timeout=30,
    )
    with SyncRecorderClient(recorder.endpoint) as client:
        assert [e.kind for e in client.list_events(run_id)] == ["run_completed"]
    assert recorder.process.poll() is None
