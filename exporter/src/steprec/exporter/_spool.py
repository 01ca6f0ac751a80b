"""A bounded on-disk queue of export requests the recorder could not take yet.

Each process appends to its own segment file, which it holds an exclusive
lock on while it lives. A segment whose lock can be taken belongs to a process
that died; any later process using the same spool folder adopts and drains it,
so records a crashed agent could not deliver still arrive. Frames are sent in
order and a segment's progress is kept in a `.pos` file beside it; a frame
sent twice after a crash is harmless, because the recorder suppresses replays
by idempotency key.

The spool keeps the end offset of every unsent frame in memory (an integer per
request), so the oldest requests are read with one positioned read, however
long the segment: re-reading a segment from its start for every request made
draining quadratic in the spool's size.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from steprec.proto.framing import append_frame, encode_frame, open_for_append, read_frames

logger = logging.getLogger(__name__)


_FRAME_OVERHEAD = len(encode_frame(0, b""))
"""Bytes a frame adds before its payload (`steprec.proto.framing`: length, sequence, checksum)."""


@dataclass
class _Segment:
    path: Path
    lock: BinaryIO
    """Read handle holding the segment's `flock`; the spool reads frames through it."""
    position: int
    """Byte offset of the first frame not yet acknowledged."""
    ends: deque[int]
    """End offsets of the frames after `position`, in order."""

    @property
    def pos_path(self) -> Path:
        return self.path.with_suffix(".pos")

    def unsent_bytes(self) -> int:
        return self.ends[-1] - self.position if self.ends else 0

    def oldest(self, max_bytes: int) -> tuple[int, list[bytes]]:
        """Payloads of the oldest unsent frames, as many as fit in `max_bytes` (at least one), and where they end."""
        last = 0
        while last + 1 < len(self.ends) and self.ends[last + 1] - self.position <= max_bytes:
            last += 1
        data = os.pread(self.lock.fileno(), self.ends[last] - self.position, self.position)
        payloads, start = [], self.position
        for end in itertools.islice(self.ends, last + 1):
            payloads.append(data[start - self.position + _FRAME_OVERHEAD : end - self.position])
            start = end
        return start, payloads

    def advance(self, end: int) -> None:
        while self.ends and self.ends[0] <= end:
            self.ends.popleft()
        self.position = end
        self.pos_path.write_text(str(end))

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.pos_path.unlink(missing_ok=True)
        self.lock.close()


def _try_lock(path: Path) -> BinaryIO | None:
    handle = open(path, "rb")  # noqa: SIM115 - held for the segment's lifetime
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


class Spool:
    """FIFO of encoded requests on disk, bounded in bytes; `dropped` counts what did not fit."""

    def __init__(self, directory: Path, *, max_bytes: int) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.directory = directory
        self.max_bytes = max_bytes
        self.dropped = 0
        self._segments: deque[_Segment] = deque(self._adopt_orphans())
        self._writer: BinaryIO | None = None
        self._sequence = 0
        if self._segments:
            logger.warning(
                "steprec: adopted %d spool segment(s) from an earlier process in %s; re-sending them",
                len(self._segments),
                directory,
            )

    def _adopt_orphans(self) -> list[_Segment]:
        adopted = []
        for path in sorted(self.directory.glob("spool-*.log")):
            lock = _try_lock(path)
            if lock is None:
                continue  # a live process owns it
            pos_path = path.with_suffix(".pos")
            position = int(pos_path.read_text() or 0) if pos_path.exists() else 0
            ends = deque(end for _, end, _ in read_frames(path) if end > position)  # stops before a torn frame
            adopted.append(_Segment(path, lock, position, ends))
        return adopted

    def __bool__(self) -> bool:
        return bool(self._segments)

    def pending_bytes(self) -> int:
        return sum(segment.unsent_bytes() for segment in self._segments)

    def append(self, payload: bytes) -> bool:
        """Queue one request; False (and counted, and warned) when it would exceed the bound or
        cannot be written (a full disk): a barrier is then answered `dropped`, never left waiting."""
        if self.pending_bytes() + len(payload) > self.max_bytes:
            return self._drop(len(payload), f"is full ({self.max_bytes} bytes)")
        try:
            self._write(payload)
        except OSError as error:
            return self._drop(len(payload), f"cannot take it ({error})")
        return True

    def _write(self, payload: bytes) -> None:
        if self._writer is None:
            path = self.directory / f"spool-{os.getpid()}-{uuid.uuid4().hex}.log"
            self._writer, _ = open_for_append(path)
            lock = _try_lock(path)
            assert lock is not None
            self._segments.append(_Segment(path, lock, 0, deque()))
            os.chmod(path, 0o600)
        segment = self._segments[-1]
        start = segment.ends[-1] if segment.ends else segment.position
        self._sequence += 1
        try:
            append_frame(self._writer, self._sequence, payload)  # all of the frame or none of it
        except OSError:
            if os.fstat(self._writer.fileno()).st_size != start:  # even the cut failed: never append after a torn frame
                self._writer.close()
                self._writer = None
            raise
        segment.ends.append(start + _FRAME_OVERHEAD + len(payload))

    def _drop(self, size: int, why: str) -> bool:
        self.dropped += 1
        logger.warning(
            "steprec: spool %s %s; dropped a request of %d bytes (%d dropped so far)",
            self.directory,
            why,
            size,
            self.dropped,
        )
        return False

    def peek(self, max_bytes: int = 0) -> tuple[int, list[bytes]] | None:
        """The oldest unsent requests, as many as fit in `max_bytes` (at least one), and the offset
        `acknowledge` takes once they were delivered; None when the spool is empty."""
        while self._segments:
            if self._segments[0].ends:
                return self._segments[0].oldest(max_bytes)
            self._retire_head()
        return None

    def acknowledge(self, end: int) -> None:
        """The requests `peek` returned were delivered; move past them."""
        self._segments[0].advance(end)
        if not self._segments[0].ends:
            self._retire_head()

    def _retire_head(self) -> None:
        head = self._segments.popleft()
        if self._writer is not None and self._writer.name == str(head.path):
            self._writer.close()
            self._writer = None
        head.remove()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        for segment in self._segments:
            segment.lock.close()
