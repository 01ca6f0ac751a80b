"""Synthetic OTLP load: export requests of small step events, for the ingest benchmark and the load tests."""

from __future__ import annotations

import time

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from steprec.proto import wire


def step_events_request(
    run_id: str, number: int, records: int, *, padding: int = 0
) -> logs_service_pb2.ExportLogsServiceRequest:
    """Request `number` of a load sender: `records` events of run `run_id`, keys `<number>:<i>` unique per
    request, each with a `pad` attribute of `padding` characters when records should weigh something."""

    def attribute(key: str, value: str | int) -> KeyValue:
        any_value = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
        return KeyValue(key=key, value=any_value)

    log_records = [
        LogRecord(
            time_unix_nano=time.time_ns(),
            event_name=wire.EVENT_PREFIX + "model_request_started",
            attributes=[
                attribute(wire.RUN_ID, run_id),
                attribute(wire.STEP_INDEX, number),
                attribute(wire.IDEMPOTENCY_KEY, f"{number}:{i}"),
                *([attribute("pad", "x" * padding)] if padding else []),
            ],
        )
        for i in range(records)
    ]
    return logs_service_pb2.ExportLogsServiceRequest(
        resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=log_records)])]
    )
