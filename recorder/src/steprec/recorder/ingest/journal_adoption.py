"""The recorder delivers dead agents' journals: it scans journal folders and ingests orphaned segments.

An agent journals every request before sending it; a process killed before
its delivery thread sent the last frames leaves them in its segment, whose
lock the kernel released. Scanning the folders it was given (and, on
loopback, the default folder of its own endpoint) at least once a second,
the recorder takes such a segment's lock, ingests its unacknowledged frames
through the same validation as an OTLP Export (`LogsIngest.ingest`), moves
its position after each, and removes it. Replays are suppressed by
idempotency key, so a frame the agent had sent already is stored once.

A segment is a stranger's input: a frame that is not an OTLP request, or
bytes after the last intact frame, set the segment aside in `rejected/`
once its good frames are stored, with a warning; nothing in it can stop the
recorder. When the store cannot write, the segment is released and tried at
the next scan. Only segments owned by the user the recorder runs as are
adopted (agents write theirs owner-only): a segment of another user is left
alone with one warning, since ingesting it would store records that bypass
the recorder's token.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from steprec.proto.journal import SEGMENT_GLOB, Segment, default_journal_dir, orphans

from ..store.applier import StoreUnavailable
from .otlp import LogsIngest

logger = logging.getLogger(__name__)

SCAN_SECONDS = 0.5
_BATCH_BYTES = 2 << 20
"""Frames ingested together, as one request: what an agent's delivery thread sends per Export."""


def loopback_folders(host: str, port: int) -> list[Path]:
    """The default journal folders of agents that reach a recorder on loopback at `port` ([] elsewhere)."""
    bare = host.strip("[]")
    try:
        loopback = bare == "localhost" or ipaddress.ip_address(bare).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return []
    folders = [default_journal_dir(f"{name}:{port}") for name in ("127.0.0.1", "localhost", "[::1]")]
    return list(dict.fromkeys(folders))


class JournalAdopter:
    """Scans journal folders and ingests every segment whose owner died."""

    def __init__(self, ingest: LogsIngest, folders: Iterable[Path]) -> None:
        self._ingest = ingest
        self.folders = list(dict.fromkeys(folders))
        self._task: asyncio.Task[None] | None = None
        self._foreign: set[Path] = set()

    def start(self) -> None:
        if self.folders:
            self._task = asyncio.get_running_loop().create_task(self._scan_forever(), name="steprec-journal-adoption")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _scan_forever(self) -> None:
        while True:
            for folder in self.folders:
                try:
                    await self.scan(folder)
                except Exception:  # a scan must never end the recorder's adoption
                    logger.exception("adopting journals in %s failed; trying again at the next scan", folder)
            await asyncio.sleep(SCAN_SECONDS)

    async def scan(self, folder: Path) -> int:
        """Ingest every orphaned segment in `folder`; how many were delivered whole."""
        if not folder.is_dir():
            return 0
        self._warn_of_foreign_segments(folder)
        delivered = 0
        for segment in orphans(folder, owner=os.geteuid()):
            try:
                delivered += await self._deliver(segment)
            except StoreUnavailable as error:
                logger.warning("journal %s waits: the store cannot write (%s)", segment.path, error)
                segment.release()
            except Exception:
                logger.exception("journal %s could not be adopted; set aside", segment.path)
                segment.set_aside()
        return delivered

    def _warn_of_foreign_segments(self, folder: Path) -> None:
        for path in folder.glob(SEGMENT_GLOB):
            try:
                owner = path.lstat().st_uid
            except OSError:
                continue  # retired while we looked
            if owner != os.geteuid() and path not in self._foreign:
                self._foreign.add(path)
                logger.warning("journal %s belongs to uid %d, not to this recorder's user (%d); not adopted",
                               path, owner, os.geteuid())  # fmt: skip

    async def _deliver(self, segment: Segment) -> bool:
        """Ingest the segment's frames in order, many per request; True when it was delivered whole."""
        frames = records = refused = 0
        while segment.ends:
            end, payloads, foreign = segment.oldest_requests(_BATCH_BYTES)
            if payloads:
                # Each payload parsed alone already; concatenated, they are one request holding all their records.
                request = ExportLogsServiceRequest.FromString(b"".join(payloads))
                refused += len(self._ingest.ingest(request))
                frames += len(payloads)
                records += sum(len(scope.log_records) for logs in request.resource_logs for scope in logs.scope_logs)
            if foreign:
                segment.advance(end)
                where = segment.set_aside()
                logger.warning("journal %s: frame %d is not an OTLP request; the frames before it are stored, the"
                               " segment set aside as %s", segment.path, frames, where)  # fmt: skip
                return False
            segment.advance(end)
            await asyncio.sleep(0)  # a long journal shares the loop with live requests
        if segment.torn_bytes:
            where = segment.set_aside()
            logger.warning("journal %s: %d bytes after its last intact frame are torn or corrupt; set aside as %s",
                           segment.path, segment.torn_bytes, where)  # fmt: skip
            return False
        segment.remove()
        logger.info("adopted journal %s of a process that died: %d frames, %d records (%d refused)",
                    segment.path, frames, records, refused)  # fmt: skip
        return True
