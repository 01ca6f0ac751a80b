"""Prometheus text-format metrics on their own HTTP port (`--metrics-listen`).

Counters are plain integers updated on the ingest and applier paths (each has
one writer), rendered on request. With a token configured, a scrape must send
it too, as `Authorization: Bearer <token>`. The memory gauges show what each part
of the recorder's memory budget holds (docs/storage.md), so a growing process can
be told apart from a filling cache.
"""

from __future__ import annotations

import asyncio
import hmac
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class MemoryUse:
    """What the recorder's bounded memories hold at one moment, in bytes unless named otherwise."""

    duckdb: int
    message_cache: int
    message_cache_entries: int
    run_state: int
    run_states: int
    assembly: int
    filters: int
    arrow: int


@dataclass
class Metrics:
    export_requests: int = 0
    records_received: int = 0
    records_accepted: int = 0
    records_suppressed: int = 0
    records_rejected: Counter[str] = field(default_factory=Counter)
    ingest_seconds: float = 0.0
    apply_batches: int = 0
    apply_seconds: float = 0.0
    apply_failures: int = 0
    entries_set_aside: int = 0

    def observe_export(self, received: int, rejected: list[str], suppressed: int, seconds: float) -> None:
        self.export_requests += 1
        self.records_received += received
        self.records_rejected.update(rejected)
        self.records_suppressed += suppressed
        self.records_accepted += received - len(rejected) - suppressed
        self.ingest_seconds += seconds

    def render(self, *, data_dir: Path, pending_entries: int, memory: MemoryUse) -> str:
        database_bytes = sum(p.stat().st_size for p in data_dir.glob("steprec.duckdb*"))
        wal_bytes = sum(p.stat().st_size for p in (data_dir / "wal").glob("wal-*.log"))
        lines = [
            *_metric("steprec_export_requests_total", "counter", "OTLP Export calls answered", self.export_requests),
            *_metric("steprec_records_received_total", "counter", "log records received", self.records_received),
            *_metric("steprec_records_accepted_total", "counter", "records written to the log", self.records_accepted),
            *_metric(
                "steprec_records_suppressed_total", "counter", "replays suppressed by key", self.records_suppressed
            ),
            "# HELP steprec_records_rejected_total records refused, by reason",
            "# TYPE steprec_records_rejected_total counter",
            *(
                f'steprec_records_rejected_total{{reason="{code}"}} {n}'
                for code, n in sorted(self.records_rejected.items())
            ),
            *_metric(
                "steprec_ingest_seconds_total", "counter", "time spent validating and logging", self.ingest_seconds
            ),
            *_metric("steprec_apply_batches_total", "counter", "DuckDB transactions applied", self.apply_batches),
            *_metric("steprec_apply_seconds_total", "counter", "time spent in DuckDB transactions", self.apply_seconds),
            *_metric("steprec_apply_failures_total", "counter", "DuckDB transactions that failed", self.apply_failures),
            *_metric(
                "steprec_wal_entries_set_aside_total",
                "counter",
                "logged requests DuckDB refused for good",
                self.entries_set_aside,
            ),
            *_metric("steprec_wal_pending_entries", "gauge", "logged requests not yet in DuckDB", pending_entries),
            *_metric("steprec_wal_bytes", "gauge", "bytes in write-ahead log segments", wal_bytes),
            *_metric("steprec_database_bytes", "gauge", "bytes of the DuckDB file and its own WAL", database_bytes),
            *_metric(
                "steprec_duckdb_memory_bytes",
                "gauge",
                "memory DuckDB's buffer manager holds (duckdb_memory())",
                memory.duckdb,
            ),
            *_metric("steprec_message_cache_bytes", "gauge", "memory the message cache holds", memory.message_cache),
            *_metric(
                "steprec_message_cache_entries", "gauge", "message bodies in the cache", memory.message_cache_entries
            ),
            *_metric("steprec_run_state_bytes", "gauge", "memory ingest's per-run state holds", memory.run_state),
            *_metric("steprec_run_states", "gauge", "runs whose ingest state is in memory", memory.run_states),
            *_metric("steprec_assembly_bytes", "gauge", "pieces of unfinished large messages held", memory.assembly),
            *_metric(
                "steprec_filter_bytes", "gauge", "the Bloom filters over message digests and run ids", memory.filters
            ),  # fmt: skip
            *_metric("steprec_arrow_allocated_bytes", "gauge", "pyarrow's memory pool in use", memory.arrow),
        ]
        return "\n".join(lines) + "\n"


def _metric(name: str, kind: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]


async def serve_metrics(listen: str, render, token: str | None) -> asyncio.Server:
    """A minimal HTTP/1.1 server answering GET /metrics; anything else gets 404."""
    expected = f"Bearer {token}".encode() if token else None

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
            method, path, *_ = request_line.split(" ") + ["", ""]
            if expected is not None and not hmac.compare_digest(headers.get("authorization", "").encode(), expected):
                status, body = "401 Unauthorized", "this recorder requires a token\n"
            elif method != "GET" or path.split("?")[0] != "/metrics":
                status, body = "404 Not Found", "only GET /metrics is served here\n"
            else:
                status, body = "200 OK", render()
            payload = body.encode()
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    host, _, port = listen.rpartition(":")
    return await asyncio.start_server(handle, host, int(port))
