"""This process's journal: every request it sends is first a frame in its own segment on disk.

One `write()` per append, which the kernel keeps when the process is killed
(`fsync=True` adds an fsync, for power loss). The recorder's acknowledgement
moves the segment's position past the frames it covered. Segments of
processes that died are adopted here too, and re-sent before this process's
own frames (the segment format and adoption rules: `steprec.proto.journal`);
one holding a frame that is not an OTLP request, or a torn tail, is set aside
in `rejected/` after the frames before it, as the recorder's adopter does.

The bound counts frames not yet acknowledged: past it an append is dropped,
counted and logged, never silently, and so is an append the disk refuses.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import deque
from pathlib import Path
from typing import BinaryIO

from steprec.proto.framing import append_frame, open_for_append
from steprec.proto.journal import FRAME_OVERHEAD, Segment, check_journal_dir, orphans, try_lock

logger = logging.getLogger(__name__)

ROTATE_BYTES = 8 << 20
"""A fully acknowledged own segment past this size is removed and the next append starts a new one."""


class Journal:
    """FIFO of encoded requests on disk, bounded in unacknowledged bytes; `dropped` counts what did not fit."""

    def __init__(self, directory: Path, *, max_bytes: int, fsync: bool = False) -> None:
        self.directory = check_journal_dir(directory)
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.dropped = 0
        self._segments: deque[Segment] = deque(orphans(directory))
        self._writer: BinaryIO | None = None
        self._own: Segment | None = None
        self._sequence = 0
        if self._segments:
            logger.warning(
                "steprec: adopted %d journal segment(s) of an earlier process in %s; re-sending them",
                len(self._segments),
                directory,
            )

    def __bool__(self) -> bool:
        """True while some frame is not yet acknowledged."""
        return any(segment.ends for segment in self._segments)

    def pending_bytes(self) -> int:
        return sum(segment.unsent_bytes() for segment in self._segments)

    def append(self, payload: bytes) -> int | None:
        """Journal one request and return where its frame ends; None (counted and warned) when it would
        exceed the bound or the disk refuses it: whoever waits on it is answered `dropped`, never left waiting."""
        if self.pending_bytes() + len(payload) > self.max_bytes:
            return self._drop(len(payload), f"is full ({self.max_bytes} bytes)")
        try:
            return self._write(payload)
        except OSError as error:
            return self._drop(len(payload), f"cannot take it ({error})")

    def _write(self, payload: bytes) -> int:
        if self._writer is None or self._own is None:
            path = self.directory / f"journal-{os.getpid()}-{uuid.uuid4().hex}.log"
            self._writer, _ = open_for_append(path)
            os.chmod(path, 0o600)
            lock = try_lock(path)
            assert lock is not None, "a segment this process just made is locked by another"
            self._own = Segment(path, lock, 0, deque())
            self._segments.append(self._own)
        segment = self._own
        start = segment.ends[-1] if segment.ends else segment.position
        self._sequence += 1
        try:
            append_frame(self._writer, self._sequence, payload, fsync=self.fsync)  # all of the frame or none
        except OSError:
            if os.fstat(self._writer.fileno()).st_size != start:  # even the cut failed: never append after it
                self._writer.close()  # the segment stays queued for its frames; the next append starts another
                self._writer, self._own = None, None
            raise
        segment.ends.append(start + FRAME_OVERHEAD + len(payload))
        return segment.ends[-1]

    def _drop(self, size: int, why: str) -> None:
        self.dropped += 1
        logger.warning(
            "steprec: journal %s %s; dropped a request of %d bytes (%d dropped so far)",
            self.directory,
            why,
            size,
            self.dropped,
        )

    def peek(self, max_bytes: int = 0) -> tuple[int, list[bytes], bool] | None:
        """The oldest unacknowledged requests, as many as fit in `max_bytes` (at least one), the offset
        `acknowledge` takes once they were delivered, and whether they are this process's own;
        None when everything is acknowledged."""
        while self._segments:
            head = self._segments[0]
            if head.ends:
                if head is self._own:
                    return *head.oldest(max_bytes), True
                # Sent whole, a frame that is not an OTLP request would be refused as a whole request and
                # retried forever, holding every frame behind it (this process's own ones too).
                end, payloads, _ = head.oldest_requests(max_bytes)
                if payloads:
                    return end, payloads, False
                self._set_aside(head, f"the frame at byte {head.position} is not an OTLP request")
                continue
            if head is self._own:
                return None
            self._retire(head)
        return None

    def acknowledge(self, end: int) -> None:
        """The requests `peek` returned were delivered; move past them."""
        head = self._segments[0]
        head.advance(end)
        if not head.ends and (head is not self._own or end >= ROTATE_BYTES):
            self._retire(head)

    def _retire(self, segment: Segment) -> None:
        if segment is not self._own and segment.torn_bytes:
            self._set_aside(segment, f"{segment.torn_bytes} bytes after its last intact frame are torn or corrupt")
            return
        self._segments.remove(segment)
        if segment is self._own:
            if self._writer is not None:
                self._writer.close()
            self._writer, self._own = None, None
        segment.remove()

    def _set_aside(self, segment: Segment, why: str) -> None:
        """Move an adopted segment to `rejected/` (as the recorder's adopter does), its good frames sent."""
        self._segments.remove(segment)
        name, where = segment.path.name, segment.set_aside()
        logger.warning("steprec: adopted journal segment %s: %s; the frames before were sent, the segment set "
                       "aside as %s", name, why, where)  # fmt: skip

    def close(self) -> None:
        """Release every segment; a fully acknowledged own segment is removed, any other stays for adoption."""
        for segment in list(self._segments):
            if segment.ends:
                segment.release()
            else:
                self._retire(segment)
        if self._writer is not None:
            self._writer.close()
        self._segments.clear()
        self._writer, self._own = None, None
