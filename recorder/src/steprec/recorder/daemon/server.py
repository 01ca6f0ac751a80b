"""The recorder daemon: OTLP ingest and the query service on one grpc.aio port."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from steprec.proto.admin.v1 import admin_pb2, admin_pb2_grpc
from steprec.proto.conversations.v1 import conversations_pb2, conversations_pb2_grpc
from steprec.proto.query.v1 import query_pb2

from ..ingest.journal_adoption import JournalAdopter, loopback_folders
from ..ingest.otlp import LogsIngest
from ..lake.location import LakeLocation
from ..querier.admin_service import RecorderAdmin
from ..querier.conversation_service import RecorderConversations
from ..querier.query_service import RecorderQuery
from ..querier.sql import QuerySlots
from ..store.connection import DEFAULT_MEMORY_LIMIT_MIB, skip_pandas_lookups
from ..store.duckdb_store import DuckDBStore
from ..store.media import DEFAULT_THRESHOLD, open_media_store
from ..store.message_cache import DEFAULT_CACHE_BYTES
from ..store.run_state import DEFAULT_RUN_STATE_BYTES
from . import allocators
from .auth import ReadableRequests, TokenAuth
from .metrics import serve_metrics
from .settings import DEFAULT_UI_LISTEN

if TYPE_CHECKING:
    from ..ui.serving import BrowserServer

logger = logging.getLogger(__name__)

DATABASE_NAME = "steprec.duckdb"
GC_THRESHOLDS = (20_000, 20, 20)
"""CPython's collector runs its youngest generation every 700 allocations by default; a request of 512
records allocates tens of thousands of objects, none in a cycle, so each request paid for dozens of
collections. Fewer, as measured in docs/benchmarks.md ("Real agent traffic")."""
SHUTDOWN_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class ServeOptions:
    listen: str = "127.0.0.1:4317"
    data_dir: Path = Path("steprec-data")
    fsync: bool = False
    max_snapshots_per_run: int | None = None
    duckdb_memory_mib: int = DEFAULT_MEMORY_LIMIT_MIB
    """DuckDB's memory limit (page cache and queries); it spills to disk beyond it."""
    message_cache_mib: int = DEFAULT_CACHE_BYTES >> 20
    """Memory for recently written or read message bodies."""
    run_state_mib: int = DEFAULT_RUN_STATE_BYTES >> 20
    """Memory for ingest's state of recently written runs; others are loaded again when they return."""
    token: str | None = field(default=None, repr=False)
    """Required bearer token for every call but health checks (never printed)."""
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    """With a client CA, clients must present a certificate it signed (mutual TLS)."""
    media: str | None = None
    """Where media blobs go: `s3://bucket/prefix`, a folder, or None for `<data>/media`."""
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = field(default=None, repr=False)
    media_threshold: int = DEFAULT_THRESHOLD
    """String parts of this many bytes or more are stored as media blobs (BinaryContent always is)."""
    metrics_listen: str | None = None
    """HOST:PORT for Prometheus metrics over HTTP (GET /metrics); off when unset."""
    adopt_journals: tuple[Path, ...] = ()
    """Journal folders whose dead agents' segments this recorder delivers (plus, on loopback, its default one)."""
    ui_listen: str | None = DEFAULT_UI_LISTEN
    """HOST:PORT for the run browser; None: off."""
    lake: str | None = None
    """A DuckLake catalog string (docs/lake.md): store there, with other recorders, instead of the DuckDB file."""
    lake_data: str | None = None
    """The lake's data: s3://bucket/prefix or a folder."""
    lake_maintain_seconds: int = 600
    """How often a lake recorder runs DuckLake's maintenance (lake/maintenance.py)."""

    def lake_location(self) -> LakeLocation | None:
        if (self.lake is None) != (self.lake_data is None):
            raise ValueError("--lake and --lake-data go together: the catalog and where its data files go")
        if self.lake is None:
            return None
        return LakeLocation(
            self.lake, self.lake_data, s3_endpoint_url=self.s3_endpoint_url, s3_region=self.s3_region,
            s3_access_key_id=self.s3_access_key_id, s3_secret_access_key=self.s3_secret_access_key,
        )  # fmt: skip

    def credentials(self) -> grpc.ServerCredentials | None:
        if self.tls_cert is None and self.tls_key is None:
            if self.tls_client_ca is not None:
                raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
            return None
        if self.tls_cert is None or self.tls_key is None:
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        return grpc.ssl_server_credentials(
            [(self.tls_key.read_bytes(), self.tls_cert.read_bytes())],
            root_certificates=self.tls_client_ca.read_bytes() if self.tls_client_ca else None,
            require_client_auth=self.tls_client_ca is not None,
        )


class Recorder:
    """A running recorder: start it, read its port, stop it (draining in-flight requests)."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        lake = options.lake_location()
        self.store = DuckDBStore(
            options.data_dir / DATABASE_NAME,
            fsync=options.fsync,
            max_snapshots_per_run=options.max_snapshots_per_run,
            memory_limit_mib=options.duckdb_memory_mib,
            message_cache_bytes=options.message_cache_mib << 20,
            run_state_bytes=options.run_state_mib << 20,
            media_threshold=options.media_threshold,
            lake=lake,
            lake_maintain_seconds=options.lake_maintain_seconds,
            media_store=open_media_store(
                options.media or (lake.media_location() if lake else None),
                options.data_dir,
                fsync=options.fsync,
                endpoint_url=options.s3_endpoint_url,
                region=options.s3_region,
                access_key_id=options.s3_access_key_id,
                secret_access_key=options.s3_secret_access_key,
            ),
        )
        # The token first: a stranger without it learns nothing, not even whether their bytes parse.
        interceptors = [*([TokenAuth(options.token)] if options.token else []), ReadableRequests()]
        self._server = grpc.aio.server(interceptors=interceptors)
        ingest = LogsIngest(self.store)
        self._server.add_generic_rpc_handlers((ingest.handler(),))
        self.sql_slots = QuerySlots()
        self._server.add_generic_rpc_handlers((RecorderQuery(self.store, self.sql_slots).handler(),))
        admin_pb2_grpc.add_RecorderAdminServicer_to_server(RecorderAdmin(self.store), self._server)
        conversations_pb2_grpc.add_RecorderConversationsServicer_to_server(
            RecorderConversations(self.store), self._server
        )
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (
                "opentelemetry.proto.collector.logs.v1.LogsService",
                query_pb2.DESCRIPTOR.services_by_name["RecorderQuery"].full_name,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                admin_pb2.DESCRIPTOR.services_by_name["RecorderAdmin"].full_name,
                conversations_pb2.DESCRIPTOR.services_by_name["RecorderConversations"].full_name,
                reflection.SERVICE_NAME,
            ),
            self._server,
        )
        credentials = options.credentials()
        if credentials is None:
            self.port = self._server.add_insecure_port(options.listen)
        else:
            self.port = self._server.add_secure_port(options.listen, credentials)
        if self.port == 0:
            raise OSError(f"could not listen on {options.listen}")
        host = options.listen.rsplit(":", 1)[0]
        self.adopter = JournalAdopter(ingest, [*options.adopt_journals, *loopback_folders(host, self.port)])
        self.browser: BrowserServer | None = None

    async def start(self) -> None:
        await self._server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.adopter.start()
        await self._start_browser()

    async def _start_browser(self) -> None:
        """The run browser on `ui_listen`: a taken default port is said and skipped; a port asked for is an error."""
        options = self.options
        if options.ui_listen is None:
            return
        from ..ui.app import browser_app  # the web stack is loaded only when the browser is served
        from ..ui.serving import BrowserTLS, bind, start_browser

        try:
            sock = bind(options.ui_listen)
        except OSError as error:
            if options.ui_listen != DEFAULT_UI_LISTEN:
                raise
            logger.warning("%s; serving without the browser (choose another with --ui-listen)", error.strerror)
            return
        endpoint = f"{'https://' if options.tls_cert else ''}{options.listen.rsplit(':', 1)[0]}:{self.port}"
        app = browser_app(self.store, endpoint=endpoint, token=options.token, sql_slots=self.sql_slots)
        tls = BrowserTLS(options.tls_cert, options.tls_key, options.tls_client_ca)
        self.browser = await start_browser(app, sock, tls)

    async def stop(self, grace: float = SHUTDOWN_GRACE_SECONDS) -> None:
        await self._health.enter_graceful_shutdown()
        await self.adopter.stop()
        if self.browser is not None:
            await self.browser.stop()
        await self._server.stop(grace)
        self.store.close()

    async def wait(self) -> None:
        await self._server.wait_for_termination()


async def serve(options: ServeOptions) -> None:
    """Run until SIGTERM or SIGINT, then drain, commit and exit."""
    os.umask(0o077)  # every file the recorder makes (DuckDB's own WAL included) is owner-only
    skip_pandas_lookups()
    recorder = Recorder(options)
    await recorder.start()
    gc.freeze()  # what start-up loaded (modules, filters, state) stays out of every later collection
    gc.set_threshold(*GC_THRESHOLDS)
    host = options.listen.rsplit(":", 1)[0]
    if options.metrics_listen:
        store = recorder.store
        metrics_server = await serve_metrics(
            options.metrics_listen,
            lambda: store.metrics.render(
                data_dir=options.data_dir, pending_entries=store.pending_entries, memory=store.memory_use()
            ),
            options.token,
        )
        metrics_host, metrics_port = metrics_server.sockets[0].getsockname()[:2]
        print(f"steprec metrics on http://{metrics_host}:{metrics_port}/metrics", flush=True)
    if recorder.browser is not None:
        print(f"steprec browser on {recorder.browser.url}", flush=True)
    scheme = "https" if options.tls_cert else "http"
    print(f"steprec recorder listening on {scheme}://{host}:{recorder.port} (data: {options.data_dir})", flush=True)
    if recorder.adopter.folders:
        logger.info("adopting dead agents' journals in %s", ", ".join(map(str, recorder.adopter.folders)))
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    trimming = threading.Event()
    allocators.trim_periodically(trimming)
    await stopping.wait()
    logger.info("stopping: draining in-flight requests")
    trimming.set()
    await recorder.stop()
