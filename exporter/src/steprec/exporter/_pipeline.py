"""One logs pipeline per recorder endpoint and journal, shared by every StepRecorder in the process.

Sharing keeps one connection, one journal segment and one emit order for an
orchestrator and its delegates, and gives interpreter exit a single place to
deliver what is pending. The pipeline is private to steprec: it never touches
the global LoggerProvider, so an application's own logging setup neither
receives nor reroutes steps. Records are encoded by `_records` straight to
OTLP bytes and sent by the stock OTLP gRPC exporter (`_acknowledged_export`).
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from steprec.proto import wire
from steprec.proto.tls import ClientTLS

from ._acknowledged_export import AcknowledgedLogExporter
from ._delivery import OrderedDeliveryProcessor
from ._journal import Journal
from ._otlp import RequestEnvelope

try:
    EXPORTER_VERSION = version("steprec-exporter")
except PackageNotFoundError:  # running from a source tree without installing
    EXPORTER_VERSION = "0+unknown"

_SHUTDOWN_TIMEOUT_MILLIS = 10_000


@dataclass(frozen=True)
class DeliveryOptions:
    """Everything that makes two StepRecorders need different pipelines."""

    endpoint: str
    timeout_seconds: float
    journal_dir: Path
    journal_max_bytes: int
    journal_fsync: bool = False
    token: str | None = field(default=None, repr=False)
    tls: ClientTLS = ClientTLS()


_lock = threading.Lock()
_pipelines: dict[DeliveryOptions, OrderedDeliveryProcessor] = {}


def pipeline_for(options: DeliveryOptions) -> OrderedDeliveryProcessor:
    """The shared pipeline for these options, created on first use (adopting dead processes' journal segments)."""
    with _lock:
        if (pipeline := _pipelines.get(options)) is None:
            secure = options.endpoint.startswith("https://") or options.tls.configured
            exporter = AcknowledgedLogExporter(
                endpoint=options.endpoint,
                insecure=not secure,
                credentials=options.tls.credentials() if options.tls.configured else None,
                timeout=options.timeout_seconds,
                headers={"authorization": f"Bearer {options.token}"} if options.token else None,
            )
            journal = Journal(options.journal_dir, max_bytes=options.journal_max_bytes, fsync=options.journal_fsync)
            envelope = RequestEnvelope(
                {"service.name": "steprec", "steprec.exporter.version": EXPORTER_VERSION},
                wire.SCOPE_NAME,
                EXPORTER_VERSION,
            )
            pipeline = OrderedDeliveryProcessor(exporter, journal, envelope)
            _pipelines[options] = pipeline
        return pipeline


def shutdown_pipelines() -> None:
    """Deliver what is pending (bounded in time) and close every pipeline."""
    with _lock:
        pipelines = list(_pipelines.values())
        _pipelines.clear()
    for pipeline in pipelines:
        pipeline.force_flush(_SHUTDOWN_TIMEOUT_MILLIS)
        pipeline.shutdown()


atexit.register(shutdown_pipelines)
