"""Message JSON streamed as `SnapshotChunk`s, both ways: the recorder's answers and a conversation head's upload.

The contract (query.proto, SnapshotChunk): whole messages packed into chunks of about `CHUNK_BYTES`, a
larger one in consecutive `message_piece`s, the last with `message_complete`. Every stream stays far
below gRPC's 4 MiB message cap, however large one message (an image) is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from .query.v1 import query_pb2 as pb

CHUNK_BYTES = 1 << 20
"""Streamed messages are packed up to about 1 MiB per gRPC message, far below the 4 MiB cap."""


def message_chunks(chunk: pb.SnapshotChunk, messages: Iterable[bytes]) -> Iterator[pb.SnapshotChunk]:
    """`chunk` and more, carrying `messages` in order; the last one yielded may carry none."""
    size = 0
    for encoded in messages:
        if size and size + len(encoded) > CHUNK_BYTES:
            yield chunk
            chunk, size = pb.SnapshotChunk(), 0
        if len(encoded) <= CHUNK_BYTES:
            chunk.messages_json.append(encoded)
            size += len(encoded)
            continue
        if chunk.ListFields():
            yield chunk
            chunk = pb.SnapshotChunk()
        for start in range(0, len(encoded), CHUNK_BYTES):
            piece = encoded[start : start + CHUNK_BYTES]
            yield pb.SnapshotChunk(message_piece=piece, message_complete=start + CHUNK_BYTES >= len(encoded))
    yield chunk


class MessageAssembly:
    """The messages of a stream of chunks, in order, pieces of a large one joined.

    `max_bytes` bounds what one stream may make the receiver hold (the recorder receiving an upload from
    a stranger); past it `add` raises ValueError saying so.
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        self.messages: list[bytes] = []
        self._piece = bytearray()
        self._bytes = 0
        self._max_bytes = max_bytes

    def add(self, chunk: pb.SnapshotChunk) -> None:
        self._bytes += len(chunk.message_piece) + sum(len(message) for message in chunk.messages_json)
        if self._max_bytes is not None and self._bytes > self._max_bytes:
            raise ValueError(f"the messages are larger than the {self._max_bytes}-byte limit")
        if chunk.message_piece:
            if chunk.messages_json:
                raise ValueError("a chunk carries a message piece and whole messages at once")
            self._piece += chunk.message_piece
            if chunk.message_complete:
                self.messages.append(bytes(self._piece))
                self._piece.clear()
            return
        self.messages.extend(chunk.messages_json)

    @property
    def complete(self) -> bool:
        """False while a large message's last piece is still to come."""
        return not self._piece
