"""Append-only files of checksummed frames: the recorder's write-ahead log and the exporter's journal.

Each frame is `length (u32) | sequence (u64) | crc32 (u32) | payload`. A
process killed mid-write leaves at most one torn frame at the end of a file;
readers stop there and writers cut it off before appending, so a crash never
turns into a corrupt record. A write that fails (a full disk) is cut off at
once, so the next frame starts where the last whole one ended.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_HEADER = struct.Struct("<IQI")
MAX_FRAME = 1 << 30


def encode_frame(sequence: int, payload: bytes) -> bytes:
    return _HEADER.pack(len(payload), sequence, zlib.crc32(payload)) + payload


def read_frames(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """`(sequence, end_offset, payload)` of every intact frame, stopping at the first torn or corrupt one."""
    with open(path, "rb") as file:
        offset = 0
        while header := file.read(_HEADER.size):
            if len(header) < _HEADER.size:
                return
            length, sequence, checksum = _HEADER.unpack(header)
            if length > MAX_FRAME:
                return
            payload = file.read(length)
            if len(payload) < length or zlib.crc32(payload) != checksum:
                return
            offset += _HEADER.size + length
            yield sequence, offset, payload


def open_for_append(path: Path) -> tuple[BinaryIO, int]:
    """The file opened for `append_frame` after its last intact frame, and that frame's sequence (or -1).

    Unbuffered: a buffered writer that failed to flush keeps the unwritten tail and writes it
    before the next frame, which would corrupt the file after a full disk was freed.
    """
    last_sequence, intact = -1, 0
    if path.exists():
        for frame in read_frames(path):
            last_sequence, intact, _ = frame
    file = open(path, "ab", buffering=0)  # noqa: SIM115 - the caller owns it
    file.truncate(intact)
    return file, last_sequence


def append_frame(file: BinaryIO, sequence: int, payload: bytes, *, fsync: bool = False) -> None:
    """Write one whole frame (and fsync it if asked), or on an OSError none of it: the file is cut
    back before re-raising, so a failed append never leaves a frame that was not acknowledged."""
    start = file.tell()
    frame = memoryview(encode_frame(sequence, payload))
    try:
        while frame:
            frame = frame[file.write(frame) :]
        if fsync:
            os.fsync(file.fileno())
    except OSError:
        file.truncate(start)
        raise
