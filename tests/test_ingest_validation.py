"""Bad OTLP input over real gRPC: refused with a reason, good records of the same request stored."""

from __future__ import annotations

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from steprec.proto import wire
from steprec.query import RecorderClient
from steprec.recorder.daemon.process import RecorderProcess


def _record(event_name: str, **attributes: object) -> LogRecord:
    values = []
    for key, value in attributes.items():
        any_value = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
        values.append(KeyValue(key=key.replace("__", "."), value=any_value))
    return LogRecord(time_unix_nano=1, event_name=event_name, attributes=values)


async def test_bad_records_are_refused_and_good_ones_stored(recorder: RecorderProcess, client: RecorderClient) -> None:
    good = _record(wire.EVENT_PREFIX + "run_completed", steprec__run__id="good-run", steprec__step__index=0)
    unknown = _record("steprec.nonsense", steprec__run__id="good-run", steprec__step__index=0)
    traversal = _record(wire.EVENT_PREFIX + "run_completed", steprec__run__id="../../etc", steprec__step__index=0)
    mistyped = _record(wire.EVENT_PREFIX + "run_completed", steprec__run__id="good-run", steprec__step__index="one")
    missing = _record(wire.EVENT_PREFIX + "run_completed", steprec__step__index=0)
    unreceived = _record(
        wire.SNAPSHOT, steprec__run__id="good-run", steprec__step__index=0, steprec__snapshot__index=0,
        steprec__snapshot__state="complete", steprec__snapshot__keep=0,
    )  # fmt: skip
    unreceived.body.kvlist_value.values.add(key=wire.BODY_APPEND_REFS).value.bytes_value = b"\x01" * 32
    too_big = _record(  # would not fit the 32-bit column: refused up front, never a poison entry in the log
        wire.SNAPSHOT, steprec__run__id="good-run", steprec__step__index=0, steprec__snapshot__index=3_000_000_000,
        steprec__snapshot__state="complete", steprec__snapshot__keep=0,
    )  # fmt: skip
    records = [unknown, good, traversal, mistyped, missing, unreceived, too_big]
    request = logs_service_pb2.ExportLogsServiceRequest(
        resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=records)])]
    )
    async with grpc.aio.insecure_channel(recorder.endpoint) as channel:
        response = await logs_service_pb2_grpc.LogsServiceStub(channel).Export(request, timeout=10)
        assert response.partial_success.rejected_log_records == 6
        lines = response.partial_success.error_message.splitlines()
        assert lines[0].startswith("record 0 [unknown_event]")
        assert lines[1].startswith("record 2 [bad_run_id]")
        assert lines[2].startswith("record 3 [bad_attribute]") and wire.STEP_INDEX in lines[2]
        assert lines[3].startswith("record 4 [missing_attribute]") and wire.RUN_ID in lines[3]
        assert lines[4].startswith("record 5 [unknown_message]") and "never received" in lines[4]
        assert lines[5].startswith("record 6 [bad_attribute]") and "3000000000" in lines[5]
        # Not protobuf at all: the server answers with a status and keeps serving.
        raw = channel.unary_unary("/opentelemetry.proto.collector.logs.v1.LogsService/Export")
        try:
            await raw(b"\xff\xff\xff not protobuf", timeout=10)
            raise AssertionError("garbage was accepted")
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "not an OTLP" in error.details()
    assert [e.kind for e in await client.list_events("good-run")] == ["run_completed"]


async def test_invalid_json_and_oversized_requests_are_refused(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    snapshot = _record(
        wire.SNAPSHOT, steprec__run__id="json-run", steprec__step__index=0, steprec__snapshot__index=0,
        steprec__snapshot__state="complete", steprec__snapshot__keep=0,
    )  # fmt: skip
    snapshot.body.kvlist_value.values.add(key=wire.BODY_MESSAGES).value.array_value.values.add(string_value="{not json")
    good = _record(wire.EVENT_PREFIX + "run_completed", steprec__run__id="json-run", steprec__step__index=0)
    request = logs_service_pb2.ExportLogsServiceRequest(
        resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=[snapshot, good])])]
    )
    huge = logs_service_pb2.ExportLogsServiceRequest(
        resource_logs=[
            ResourceLogs(scope_logs=[ScopeLogs(log_records=[LogRecord(body=AnyValue(string_value="x" * (5 << 20)))])])
        ]
    )
    async with grpc.aio.insecure_channel(recorder.endpoint) as channel:
        stub = logs_service_pb2_grpc.LogsServiceStub(channel)
        response = await stub.Export(request, timeout=10)
        assert response.partial_success.rejected_log_records == 1
        assert (
            "[bad_body]" in response.partial_success.error_message
            and "not valid JSON" in response.partial_success.error_message
        )
        try:
            await stub.Export(huge, timeout=10)
            raise AssertionError("a 5 MiB request was accepted")
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Still serving, and the good record of the first request is stored.
        assert [e.kind for e in await client.list_events("json-run")] == ["run_completed"]
