"""The bodies of recently written or read messages, in memory, so reading a live run's history skips DuckDB.

Messages are content-addressed, so an entry can never go stale: a digest names one body forever.
Reading a snapshot otherwise joins its references against the whole messages table, a scan that
grows with the store; the runs people continue or fork are mostly the ones just written.
"""

from __future__ import annotations

from steprec.proto.sized_cache import SizedCache

DEFAULT_CACHE_BYTES = 128 << 20


def message_cache(max_bytes: int = DEFAULT_CACHE_BYTES) -> SizedCache[bytes, str]:
    """A least-recently-used map from digest to stored body, bounded by the memory it holds (`--message-cache-mib`)."""
    return SizedCache[bytes, str](max_bytes)
