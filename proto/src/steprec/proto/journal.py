"""Journal segments on disk: what an agent writes and what a recorder or `steprec journal push` adopts.

An agent process appends every OTLP request it will send, as one frame
(`steprec.proto.framing`), to its own segment `journal-<pid>-<uuid>.log`, on
which it holds an exclusive `flock` while it lives. The recorder's
acknowledgement moves the segment's `.pos` file past the frames it covered.
A segment whose lock can be taken belongs to a process that died: whoever
takes the lock (the recorder scanning the folder, the next agent process, or
`steprec journal push`) owns it, re-sends its unacknowledged frames in order
and removes it. A frame sent twice is harmless: the recorder suppresses replays
by idempotency key.

A segment is input from a stranger to whoever adopts it: `adopt` reads it up to
the first torn or corrupt frame and reports how many bytes follow, so a caller
can set them aside rather than trust them.

The segment keeps the end offset of every unsent frame in memory (an integer
per request), so the oldest requests are read with one positioned read however
long the segment is.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import re
import stat
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from .framing import encode_frame, read_frames

SEGMENT_GLOB = "journal-*.log"
FRAME_OVERHEAD = len(encode_frame(0, b""))
"""Bytes a frame adds before its payload (length, sequence, checksum)."""


def endpoint_folder_name(endpoint: str) -> str:
    """The folder name of an endpoint's default journal: `127.0.0.1:4317` -> `127.0.0.1_4317`.

    The scheme and a trailing slash are left out, so `http://127.0.0.1:4317/` shares the folder
    of `127.0.0.1:4317`: a recorder finds the journal of every agent that names it.
    """
    bare = re.sub(r"^[a-z]+://", "", endpoint).rstrip("/")
    return re.sub(r"[^A-Za-z0-9_.-]", "_", bare)


def default_journal_dir(endpoint: str, environ: Mapping[str, str] | None = None) -> Path:
    """`$STEPREC_JOURNAL_DIR`, else `$XDG_STATE_HOME/steprec/journal/<endpoint>` (~/.local/state by default)."""
    environ = os.environ if environ is None else environ
    if configured := environ.get("STEPREC_JOURNAL_DIR"):
        return Path(configured)
    state = Path(environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "steprec" / "journal" / endpoint_folder_name(endpoint)


def check_journal_dir(directory: Path) -> Path:
    """Create the folder owner-only if missing; refuse one this user does not own or cannot write.

    A foreign-owned folder is refused, not used: whoever owns it could read every record or plant
    segments that another process would send as this user's.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = directory.stat()
    except FileExistsError:
        raise ValueError(f"journal folder {directory} is not a folder") from None
    except OSError as error:
        raise ValueError(f"journal folder {directory} cannot be created: {error.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"journal folder {directory} is not a folder")
    if info.st_uid != os.geteuid():
        raise ValueError(f"journal folder {directory} belongs to uid {info.st_uid}, not to this user ({os.geteuid()})")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"journal folder {directory} is not writable by this user")
    return directory


def try_lock(path: Path) -> BinaryIO | None:
    """A read handle holding `path`'s exclusive lock, or None when a live process holds it (or it is gone)."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - held for the segment's lifetime
    except OSError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


@dataclass
class Segment:
    """One journal file this process holds the lock of, and the frames of it not yet acknowledged."""

    path: Path
    lock: BinaryIO
    """Read handle holding the segment's `flock`; frames are read through it."""
    position: int
    """Byte offset of the first frame not yet acknowledged."""
    ends: deque[int]
    """End offsets of the frames after `position`, in order."""
    torn_bytes: int = 0
    """Bytes after the last intact frame when it was adopted (a torn or corrupt tail)."""
    _pos_fd: int | None = field(default=None, repr=False, compare=False)
    """The `.pos` file, kept open: an acknowledgement is then one `pwrite`, not an open, a write and a close
    (those were a tenth of the delivery thread's time, under the lock the agent's hooks take)."""

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
            payloads.append(data[start - self.position + FRAME_OVERHEAD : end - self.position])
            start = end
        return start, payloads

    def oldest_requests(self, max_bytes: int) -> tuple[int, list[bytes], bool]:
        """`oldest`, cut before the first payload that is not an OTLP request alone, and whether one was.

        An adopted segment is a stranger's input: sent with the rest, such a frame fails the whole
        Export. Each payload is parsed on its own, since concatenated bytes would parse as one merged
        message even when a frame swallows the next one's bytes.
        """
        end, payloads = self.oldest(max_bytes)
        for good, payload in enumerate(payloads):
            try:
                ExportLogsServiceRequest.FromString(payload)
            except DecodeError:
                return self.position + sum(FRAME_OVERHEAD + len(p) for p in payloads[:good]), payloads[:good], True
        return end, payloads, False

    def advance(self, end: int) -> None:
        while self.ends and self.ends[0] <= end:
            self.ends.popleft()
        self.position = end
        if self._pos_fd is None:
            self._pos_fd = os.open(self.pos_path, os.O_WRONLY | os.O_CREAT, 0o600)
        # Fixed width, so each write covers the last one whole; a reader strips the padding.
        os.pwrite(self._pos_fd, b"%020d" % end, 0)

    def release(self) -> None:
        """Close the segment's files and let go of its lock; the segment stays on disk, for adoption."""
        if self._pos_fd is not None:
            os.close(self._pos_fd)
            self._pos_fd = None
        self.lock.close()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.pos_path.unlink(missing_ok=True)
        self.release()

    def set_aside(self) -> Path:
        """Move the segment out of the journal (to `rejected/`), keeping its bytes for a person to look at."""
        rejected = self.path.parent / "rejected"
        rejected.mkdir(mode=0o700, exist_ok=True)
        target = rejected / self.path.name
        self.path.rename(target)
        self.pos_path.unlink(missing_ok=True)
        self.release()
        return target


def _read_position(pos_path: Path) -> int:
    try:
        text = pos_path.read_text().strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def adopt(path: Path) -> Segment | None:
    """Take over the segment at `path` if its owner died (its lock can be taken), else None."""
    lock = try_lock(path)
    if lock is None:
        return None
    position = _read_position(path.with_suffix(".pos"))
    frame_ends = [end for _, end, _ in read_frames(path)]  # stops before a torn or corrupt frame
    intact = frame_ends[-1] if frame_ends else 0
    if position not in (0, *frame_ends):  # not at a frame boundary: resend it all, replays are suppressed
        position = 0
    size = os.fstat(lock.fileno()).st_size
    return Segment(path, lock, position, deque(end for end in frame_ends if end > position), torn_bytes=size - intact)


def orphans(directory: Path, *, owner: int | None = None) -> list[Segment]:
    """Every segment in `directory` whose writer died, adopted, oldest name first (only files of the
    user `owner`, when given)."""
    adopted = []
    for path in sorted(directory.glob(SEGMENT_GLOB)):
        try:
            info = path.lstat()
        except OSError:
            continue  # retired while we looked
        if not stat.S_ISREG(info.st_mode):
            continue  # never follow a planted link out of the folder
        if owner is not None and info.st_uid != owner:
            continue
        if (segment := adopt(path)) is not None:
            adopted.append(segment)
    return adopted


@dataclass(frozen=True)
class SegmentStatus:
    """What `steprec journal status` shows of one segment."""

    path: Path
    owner_alive: bool
    size_bytes: int
    unsent_bytes: int
    unsent_frames: int
    torn_bytes: int


def status(directory: Path) -> list[SegmentStatus]:
    """Every segment in `directory`: its size, what is not yet acknowledged, and whether its owner lives.

    A segment whose owner died is locked for the look and released again, so a recorder
    scanning the folder at the same moment may find it busy for that instant only.
    """
    found = []
    for path in sorted(directory.glob(SEGMENT_GLOB)):
        try:
            size = path.stat().st_size
        except OSError:
            continue
        segment = adopt(path)
        if segment is None:
            if not path.exists():
                continue  # retired while we looked
            position = _read_position(path.with_suffix(".pos"))
            found.append(SegmentStatus(path, True, size, max(size - position, 0), -1, 0))
            continue
        found.append(SegmentStatus(path, False, size, segment.unsent_bytes(), len(segment.ends), segment.torn_bytes))
        segment.release()
    return found
