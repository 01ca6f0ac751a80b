"""A Bloom filter over every stored message digest, so ingest rarely has to ask DuckDB "is this new?".

Most messages a snapshot carries are new; probing the database for each would
cost a scan per request. SHA-256 digests are already uniformly random, so the
filter's hash functions are just slices of the digest. A "maybe" is checked
against the database; a "no" is certain.
"""

from __future__ import annotations

import math

_HASHES = 7
_BITS_PER_ENTRY = 10  # about 1% false positives at capacity


class DigestFilter:
    def __init__(self, capacity: int = 1 << 20) -> None:
        self._size = max(1 << 16, 1 << math.ceil(math.log2(capacity * _BITS_PER_ENTRY)))
        self._bits = bytearray(self._size // 8)
        self._mask = self._size - 1
        self.count = 0
        self.capacity = self._size // _BITS_PER_ENTRY

    def _positions(self, digest: bytes):
        for i in range(_HASHES):
            yield int.from_bytes(digest[i * 4 : i * 4 + 4], "little") & self._mask

    def add(self, digest: bytes) -> None:
        for position in self._positions(digest):
            self._bits[position >> 3] |= 1 << (position & 7)
        self.count += 1

    def might_contain(self, digest: bytes) -> bool:
        return all(self._bits[p >> 3] & (1 << (p & 7)) for p in self._positions(digest))

    @property
    def nbytes(self) -> int:
        return len(self._bits)

    @property
    def full(self) -> bool:
        return self.count > self.capacity
