"""The recorder's write-ahead log: an Export is acknowledged once its request is here.

Appending a frame costs microseconds; a DuckDB commit costs milliseconds. So
ingest validates a request, appends its bytes to this log and answers, while
one applier thread moves everything pending into DuckDB in large batches. A
process killed at any moment loses nothing it acknowledged: on start the
entries after the last applied sequence are validated and applied again, in
order. With `fsync=True` an acknowledgement also survives power loss.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

from steprec.proto.framing import append_frame, open_for_append, read_frames

ROTATE_BYTES = 64 << 20
"""A segment larger than this is closed and a new one started; a closed segment goes once all of it is applied."""


class WriteAheadLog:
    """Numbered segment files `wal-<first sequence>.log` in one folder.

    Ingest appends and the applier releases from different threads; the log's own lock keeps
    them apart, so the applier never waits for ingest's lock (which may be waiting for it).
    """

    def __init__(self, folder: Path, *, fsync: bool = False) -> None:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.folder = folder
        self.fsync = fsync
        self._lock = threading.Lock()
        segments = self._segments()
        self._path = segments[-1] if segments else self._segment_path(1)
        self._file, last = open_for_append(self._path)
        os.chmod(self._path, 0o600)
        self.last_sequence = last if last >= 0 else _first_sequence(self._path) - 1

    def _segment_path(self, first_sequence: int) -> Path:
        return self.folder / f"wal-{first_sequence:020d}.log"

    def _start_segment(self, first_sequence: int) -> None:
        self._file.close()
        self._path = self._segment_path(first_sequence)
        self._file, _ = open_for_append(self._path)
        os.chmod(self._path, 0o600)

    def skip_to(self, applied: int) -> None:
        """Continue numbering after `applied` (the log was lost or replaced while the database kept its mark)."""
        if self.last_sequence < applied:
            self._start_segment(applied + 1)
            self.last_sequence = applied

    def _segments(self) -> list[Path]:
        return sorted(self.folder.glob("wal-*.log"))

    def entries_after(self, applied: int) -> Iterator[tuple[int, bytes]]:
        """Every intact entry with a sequence above `applied`, oldest first."""
        for segment in self._segments():
            for sequence, _, payload in read_frames(segment):
                if sequence > applied:
                    yield sequence, payload

    def append(self, payload: bytes) -> int:
        """Write one entry and return its sequence; durable against a process crash once this returns.

        On an OSError (a full disk) nothing of the entry stays in the log and the sequence is not used.
        """
        with self._lock:
            append_frame(self._file, self.last_sequence + 1, payload, fsync=self.fsync)
            self.last_sequence += 1
            return self.last_sequence

    def release(self, applied: int) -> None:
        """Drop segments whose every entry is applied; start a new segment when the current one is large.

        Not only once everything is applied: under steady load something always is pending, and
        the one segment then grew without end.
        """
        with self._lock:
            self._release(applied)

    def _release(self, applied: int) -> None:
        if self._file.tell() >= ROTATE_BYTES:
            self._start_segment(self.last_sequence + 1)
        segments = self._segments()
        for segment, following in zip(segments, segments[1:], strict=False):
            if _first_sequence(following) - 1 <= applied:
                segment.unlink()

    def close(self, *, applied: int | None = None) -> None:
        """Close; when everything up to the last entry is `applied`, leave one empty segment behind."""
        with self._lock:
            if applied is not None and applied >= self.last_sequence:
                self._start_segment(self.last_sequence + 1)
                self._release(applied)
            self._file.close()


def _first_sequence(segment: Path) -> int:
    return int(segment.stem.split("-")[1])
