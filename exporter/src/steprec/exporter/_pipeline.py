"""One OpenTelemetry logs pipeline per recorder endpoint, shared by every StepRecorder in the process.

Sharing keeps one connection and one emit order for an orchestrator and its
delegates, and gives interpreter exit a single place to deliver what is pending.
The pipeline is private to steprec: it never touches the global LoggerProvider,
so an application's own logging setup neither receives nor reroutes steps.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from opentelemetry._logs import Logger
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.resources import Resource
from steprec.proto import wire
from steprec.proto.tls import ClientTLS

from ._acknowledged_export import AcknowledgedLogExporter
from ._delivery import OrderedDeliveryProcessor
from ._spool import Spool

try:
    EXPORTER_VERSION = version("steprec-exporter")
except PackageNotFoundError:  # running from a source tree without installing
    EXPORTER_VERSION = "0+unknown"

_SHUTDOWN_TIMEOUT_MILLIS = 10_000


def default_spool_dir(endpoint: str) -> Path:
    """`$STEPREC_SPOOL_DIR`, else `$XDG_STATE_HOME/steprec/spool/<endpoint>` (~/.local/state by default)."""
    if configured := os.environ.get("STEPREC_SPOOL_DIR"):
        return Path(configured)
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "steprec" / "spool" / re.sub(r"[^A-Za-z0-9_.-]", "_", endpoint)


@dataclass(frozen=True)
class DeliveryOptions:
    """Everything that makes two StepRecorders need different pipelines."""

    endpoint: str
    timeout_seconds: float
    spool_dir: Path
    spool_max_bytes: int
    token: str | None = field(default=None, repr=False)
    tls: ClientTLS = ClientTLS()


@dataclass(frozen=True)
class RecorderPipeline:
    """The LoggerProvider, its delivery processor and the logger StepRecorder emits through."""

    provider: LoggerProvider
    delivery: OrderedDeliveryProcessor
    logger: Logger


_lock = threading.Lock()
_pipelines: dict[DeliveryOptions, RecorderPipeline] = {}


def pipeline_for(options: DeliveryOptions) -> RecorderPipeline:
    """The shared pipeline for these options, created on first use (adopting orphaned spool segments)."""
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
            spool = Spool(options.spool_dir, max_bytes=options.spool_max_bytes)
            delivery = OrderedDeliveryProcessor(exporter, spool)
            provider = LoggerProvider(
                resource=Resource.create({"steprec.exporter.version": EXPORTER_VERSION}),
                shutdown_on_exit=False,
            )
            provider.add_log_record_processor(delivery)
            pipeline = RecorderPipeline(provider, delivery, provider.get_logger(wire.SCOPE_NAME, EXPORTER_VERSION))
            _pipelines[options] = pipeline
        return pipeline


def shutdown_pipelines() -> None:
    """Deliver what is pending (bounded in time) and close every pipeline."""
    with _lock:
        pipelines = list(_pipelines.values())
        _pipelines.clear()
    for pipeline in pipelines:
        pipeline.provider.force_flush(_SHUTDOWN_TIMEOUT_MILLIS)
        pipeline.provider.shutdown()


atexit.register(shutdown_pipelines)
