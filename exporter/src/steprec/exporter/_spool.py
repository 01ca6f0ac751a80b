"""A bounded on-disk queue of export requests the recorder could not take yet.

Each process appends to its own segment file, which it holds an exclusive
lock on while it lives. A segment whose lock can be taken belongs to a process
that died; any later process using the same spool folder adopts and drains it,
so records a crashed agent could not deliver still arrive. Frames are sent in
order and a segment's progress is kept in a `.pos` file beside it; a frame
sent twice after a crash is harmless, because the recorder suppresses replays
by idempotency key.
"""

from __future__ import annotations

import fcntl
import logging
import os
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from steprec.proto.framing import encode_frame, open_for_append, read_frames

logger = logging.getLogger(__name__)


@dataclass
class _Segment:
    path: Path
    lock: BinaryIO
    position: int
    """Byte offset of the first frame not yet acknowledged."""

    @property
    def pos_path(self) -> Path:
        return self.path.with_suffix(".pos")

    def unsent_bytes(self) -> int:
        return max(self.path.stat().st_size - self.position, 0)

    def next_frame(self) -> tuple[int, bytes] | None:
        for _, end, payload in _frames_from(self.path, self.position):
            return end, payload
        return None

    def advance(self, end: int) -> None:
        self.position = end
        self.pos_path.write_text(str(end))

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.pos_path.unlink(missing_ok=True)
        self.lock.close()


def _frames_from(path: Path, position: int):
    for sequence, end, payload in read_frames(path):
        if end > position:
            yield sequence, end, payload


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
            adopted.append(_Segment(path, lock, position))
        return adopted

    def __bool__(self) -> bool:
        return bool(self._segments)

    def pending_bytes(self) -> int:
        return sum(segment.unsent_bytes() for segment in self._segments)

    def append(self, payload: bytes) -> bool:
        """Queue one request; False (and counted, and warned) when it would exceed the bound."""
        if self.pending_bytes() + len(payload) > self.max_bytes:
            self.dropped += 1
            logger.warning(
                "steprec: spool %s is full (%d bytes); dropped a request of %d bytes (%d dropped so far)",
                self.directory,
                self.max_bytes,
                len(payload),
                self.dropped,
            )
            return False
        if self._writer is None:
            path = self.directory / f"spool-{os.getpid()}-{uuid.uuid4().hex}.log"
            self._writer, _ = open_for_append(path)
            os.chmod(path, 0o600)
            lock = _try_lock(path)
            assert lock is not None
            self._segments.append(_Segment(path, lock, 0))
        self._sequence += 1
        self._writer.write(encode_frame(self._sequence, payload))
        self._writer.flush()
        return True

    def peek(self) -> tuple[int, bytes] | None:
        """The oldest unsent request and its end offset, or None when empty."""
        while self._segments:
            frame = self._segments[0].next_frame()
            if frame is not None:
                return frame
            self._retire_head()
        return None

    def acknowledge(self, end: int) -> None:
        """The request `peek` returned was delivered; move past it."""
        self._segments[0].advance(end)
        if self._segments[0].next_frame() is None:
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
