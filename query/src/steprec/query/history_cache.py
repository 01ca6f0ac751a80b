"""Validated messages by digest, so continuing a run the client has read before (or a later snapshot of
it) validates only the messages it has not seen.

Validation is most of what reading a long history costs (26 ms of 45 for a 2,002-message, 3.4 MB
history, docs/benchmarks.md), and a stored message never changes: its digest names it forever.

No history handed out holds a message object that anything else holds: a message's fields may be
reassigned (pydantic-ai stamps a history's last request, and its documentation names replacing a
message or reassigning its `parts` list as the safe ways to change a history) without reaching the
cache or another reader. The validated messages are never handed out; each history hands out copies,
and lends the same copies again once nobody else references them (their reference count says so) and
their fields are as stored, so the usual loop of reading a run, running it and dropping the history
makes no new objects. What a message holds (its `parts` list, the parts, `metadata`, `usage`) is shared
between the histories one client returns, as pydantic-ai shares it between the steps of a run: it does
not support editing those in place (`MessageHistoryMutatedWarning`), and neither does this cache; code
that must, can give the client `message_cache_bytes=0`.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter, itemgetter

from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from steprec.proto.sized_cache import SizedCache
from steprec.proto.wire import split_digests

DEFAULT_CACHE_BYTES = 32 << 20
"""Messages kept, counted by their JSON size (the objects, and the copies each history lent last, take a few
times that): ten 1000-step histories."""

READS_REMEMBERED = 64
"""Reads whose last history is remembered, so their next answer's copies can be made ahead (`spare`)."""


@dataclass(frozen=True)
class Spare:
    """Copies of the history a read handed out last (`digests`), lent while its next answer travels."""

    digests: bytes
    copies: list[ModelMessage]


_fields_of = attrgetter("__dict__")
_UNHELD = list(map(sys.getrefcount, islice([object()], 0, None)))[0]
"""A copy's reference count, counted as `_History.lend` counts it, when only its history's list holds it."""


class _History:
    """A history's validated messages, never handed out, and the copies of them it lent last (None for a
    message whose copy came from another history's `spare`)."""

    __slots__ = ("messages", "size", "_fields", "_lent")

    def __init__(self, messages: tuple[ModelMessage, ...], size: int) -> None:
        self.messages, self.size = messages, size
        self._fields = [_fields_of(message) for message in messages]
        self._lent: list[ModelMessage | None] = [None] * len(messages)

    def lend(self, start: int = 0) -> list[ModelMessage]:
        """Copies of `messages[start:]`, each held by nothing else: the copy lent last when only this list
        still references it and its fields are as stored (compared by equality, as a history is compared),
        else a fresh one. Counting and comparing all of them in C first makes a repeated read of a
        2,002-message history take about half of copying it, and it leaves no new objects for the cyclic
        garbage collector, whose full collections had set the read's p99 (about 100 ms, measured)."""
        counts = list(map(sys.getrefcount, islice(self._lent, start, None)))  # before anything else refers to one
        lent = self._lent[start:]
        if counts.count(_UNHELD) == len(lent) and list(map(_fields_of, lent)) == self._fields[start:]:
            return lent  # type: ignore[return-value]
        for index, count in enumerate(counts, start):
            if count != _UNHELD or _fields_of(self._lent[index]) != self._fields[index]:
                self._lent[index] = _copy(self.messages[index])
        return self._lent[start:]  # type: ignore[return-value]


class HistoryCache:
    """Validated `ModelMessage`s by digest, and the histories handed out lately as whole, each a least-recently-
    used cache bounded by JSON bytes (`max_bytes` each: a history's messages are mostly in both).

    A whole history is kept by its concatenated digests: reading the same snapshot again (the common
    "continue this run" loop) then skips splitting and looking up each of its digests, a third of what a
    repeated read of a 2,002-message history cost the client (measured, docs/benchmarks.md).
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self._messages = SizedCache[bytes, tuple[ModelMessage, int]](max_bytes, size=itemgetter(1))
        self._histories = SizedCache[bytes, _History](max_bytes, size=attrgetter("size"))
        self._last: OrderedDict[Hashable, bytes] = OrderedDict()  # read -> the digests it handed out last

    def spare(self, read: Hashable) -> Spare | None:
        """Copies of what `read` (the same request again) handed out last, for its caller to lend while the
        recorder answers: copying a 2,002-message history took as long as the call itself (about 1.5 ms each),
        and a read of the same snapshot, or of a later one of the same run, begins with the same messages."""
        digests = self._last.get(read)
        kept = self._histories.get(digests) if digests is not None else None
        return None if kept is None else Spare(digests, kept.lend())

    async def history(
        self,
        digests: bytes,
        fetch: Callable[[list[bytes]], Awaitable[list[bytes]]],
        *,
        read: Hashable | None = None,
        spare: Spare | None = None,
    ) -> list[ModelMessage]:
        """The messages `digests` (concatenated) name, in order, each a copy nothing else holds; `fetch` gets the
        JSON of those not cached (each digest once, in order) and must return it in the same order.

        `read` names the request this answers, and `spare` what `spare(read)` lent for it: its copies are used
        for as many messages as the answer begins with the history they copy.
        """
        kept = self._histories.get(digests)
        if kept is None:
            kept = _History(*await self._resolve(split_digests(digests), fetch))
            self._histories.put(digests, kept)
        if read is not None:
            self._last[read] = digests
            self._last.move_to_end(read)
            if len(self._last) > READS_REMEMBERED:
                self._last.popitem(last=False)
        if spare is None or not digests.startswith(spare.digests):
            return kept.lend()
        return spare.copies + kept.lend(len(spare.copies))

    async def _resolve(
        self, digests: Sequence[bytes], fetch: Callable[[list[bytes]], Awaitable[list[bytes]]]
    ) -> tuple[tuple[ModelMessage, ...], int]:
        """The messages `digests` name, from the cache or fetched and validated now; and their JSON size."""
        found = self._messages.get_many(digests)  # digest -> (message, size)
        if len(found) < len(digests) and (missing := [d for d in dict.fromkeys(digests) if d not in found]):
            bodies = await fetch(missing)
            if len(bodies) != len(missing):
                raise ValueError(f"asked the recorder for {len(missing)} messages and got {len(bodies)}")
            validated = ModelMessagesTypeAdapter.validate_json(b"[" + b",".join(bodies) + b"]")
            for digest, body, message in zip(missing, bodies, validated, strict=True):
                found[digest] = entry = (message, len(body))
                self._messages.put(digest, entry)
        entries = [found[digest] for digest in digests]
        return tuple(message for message, _ in entries), sum(size for _, size in entries)


def _copy(message: ModelMessage) -> ModelMessage:
    """A shallow copy, as `copy.copy` makes it at a fifth of its cost (measured)."""
    copy = object.__new__(message.__class__)
    copy.__dict__ = message.__dict__.copy()
    return copy
