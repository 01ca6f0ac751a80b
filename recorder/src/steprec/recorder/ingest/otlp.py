"""OTLP LogsService/Export: decode, validate, commit, and only then answer.

The answer is the acknowledgement the exporter's barriers wait for, so it is
sent after the transaction committed. Refused records are reported through
OTLP partial success, one `record <i> [<code>]: <reason>` line each; the good
records of the same request are stored regardless.
"""

from __future__ import annotations

import logging
import time

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

from ..store.applier import StoreUnavailable
from ..store.duckdb_store import DuckDBStore
from .decode import Refusal, decode_request

logger = logging.getLogger(__name__)

_MAX_REASON_LINES = 100


_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"


class LogsIngest:
    """The OTLP logs receiver, writing into a DuckDBStore.

    The request is parsed here rather than by gRPC, so bytes that are not an
    OTLP request get INVALID_ARGUMENT and a reason instead of gRPC's UNKNOWN.
    """

    def __init__(self, store: DuckDBStore) -> None:
        self._store = store

    def handler(self) -> grpc.GenericRpcHandler:
        export = grpc.unary_unary_rpc_method_handler(
            self.export, response_serializer=logs_service_pb2.ExportLogsServiceResponse.SerializeToString
        )
        return grpc.method_handlers_generic_handler(_SERVICE, {"Export": export})

    def ingest(self, request: logs_service_pb2.ExportLogsServiceRequest) -> list[Refusal]:
        """Validate and stage one request, logging and counting it; its refusals, in record order.

        The one path for records from the wire and from adopted journals. Raises `StoreUnavailable`
        (nothing of the request stored) when the store cannot write.
        """
        started = time.perf_counter()
        records, refusals = decode_request(request)
        try:
            # Inline, not in a worker thread: ingest is sequential anyway and takes well under a
            # millisecond, less than a thread hand-off costs; the slow part (DuckDB) is the applier's.
            refused_in_store, suppressed = self._store.ingest(records)
        except StoreUnavailable as error:
            logger.warning("refused a request of %d records: %s", len(records), error)
            raise
        refusals = sorted(refusals + refused_in_store, key=lambda r: r.index)
        self._store.metrics.observe_export(
            received=len(records) + len(refusals) - len(refused_in_store),
            rejected=[r.code for r in refusals],
            suppressed=suppressed,
            seconds=time.perf_counter() - started,
        )
        for refusal in refusals[:10]:
            logger.warning("refused %s", refusal.line())
        return refusals

    async def export(
        self, payload: bytes, context: grpc.aio.ServicerContext
    ) -> logs_service_pb2.ExportLogsServiceResponse:
        try:
            request = logs_service_pb2.ExportLogsServiceRequest.FromString(payload)
        except DecodeError as error:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"the request is not an OTLP ExportLogsServiceRequest: {error}"
            )
        try:
            refusals = self.ingest(request)
        except StoreUnavailable as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{error}; nothing of this request was stored, retry")
        except Exception:
            logger.exception("ingest of a request failed; nothing of it was stored")
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the recorder could not commit this request; retry")
        response = logs_service_pb2.ExportLogsServiceResponse()
        if refusals:
            lines = [r.line() for r in refusals[:_MAX_REASON_LINES]]
            if len(refusals) > _MAX_REASON_LINES:
                lines.append(f"... and {len(refusals) - _MAX_REASON_LINES} more")
            response.partial_success.rejected_log_records = len(refusals)
            response.partial_success.error_message = "\n".join(lines)
        return response
