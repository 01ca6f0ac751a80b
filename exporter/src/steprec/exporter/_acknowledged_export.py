"""The OTLP gRPC log exporter, plus what the stock one throws away: which records were refused.

`OTLPLogExporter.export` answers only SUCCESS or FAILURE, dropping the response's
`partial_success`. steprec needs it: a second registration of an explicit run id
comes back as a refused record, and the capability must turn that into
`ValueError`. It also sends requests encoded earlier (journal frames, as bytes).
Everything else (channel, credentials, headers, compression, the
`OTEL_EXPORTER_OTLP_*` environment) stays the stock exporter's.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

import grpc
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.sdk._logs.export import LogRecordExportResult

_REFUSAL_LINE = re.compile(r"^record (\d+) \[([a-z_]+)\]: (.*)$")


@dataclass(frozen=True)
class Refusal:
    """One record the recorder refused, with its machine code and explanation."""

    index: int
    code: str
    reason: str


@dataclass(frozen=True)
class ExportOutcome:
    """What one export call achieved: delivered at all, and which records were refused."""

    delivered: bool
    refusals: tuple[Refusal, ...] = field(default=())


def parse_refusals(error_message: str) -> tuple[Refusal, ...]:
    """Refusals from a partial-success message; lines that do not parse are ignored."""
    refusals = []
    for line in error_message.splitlines():
        if match := _REFUSAL_LINE.match(line.strip()):
            refusals.append(Refusal(int(match[1]), match[2], match[3]))
    return tuple(refusals)


def _serialize(request: bytes | ExportLogsServiceRequest) -> bytes:
    return request if isinstance(request, bytes) else request.SerializeToString()


class _ResponseKeepingStub:
    """The LogsService stub, taking requests already encoded, that remembers the last response per thread."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._export = channel.unary_unary(
            "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
            request_serializer=_serialize,
            response_deserializer=ExportLogsServiceResponse.FromString,
        )
        self.last = threading.local()

    def Export(self, request, metadata=None, timeout=None):  # noqa: N802 - gRPC method name
        response = self._export(request, metadata=metadata, timeout=timeout)
        self.last.response = response
        return response


class AcknowledgedLogExporter(OTLPLogExporter):
    """`OTLPLogExporter` that sends pre-encoded requests and reports per-record refusals.

    It does not retry: a failed request stays in steprec's journal, which the
    delivery thread re-sends in the background, so a recorder that is down costs the agent
    one failed call, not a backoff schedule.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._retryable_error_codes = frozenset()

    def _initialize_channel_and_stub(self) -> None:
        self._stub = _ResponseKeepingStub
        super()._initialize_channel_and_stub()

    def _translate_data(self, data):
        return data if isinstance(data, bytes | ExportLogsServiceRequest) else super()._translate_data(data)

    def _count_data(self, data) -> int:
        if isinstance(data, bytes):
            return 1  # only for the stock exporter's log lines; counting would mean parsing
        if isinstance(data, ExportLogsServiceRequest):
            return sum(len(s.log_records) for r in data.resource_logs for s in r.scope_logs)
        return super()._count_data(data)

    def send(self, request: bytes | ExportLogsServiceRequest) -> ExportOutcome:
        client = self._client
        if isinstance(client, _ResponseKeepingStub):
            client.last.response = None
        if self._export(request) is not LogRecordExportResult.SUCCESS:
            return ExportOutcome(delivered=False)
        response = getattr(client.last, "response", None) if isinstance(client, _ResponseKeepingStub) else None
        if response is None or not response.partial_success.rejected_log_records:
            return ExportOutcome(delivered=True)
        return ExportOutcome(delivered=True, refusals=parse_refusals(response.partial_success.error_message))
