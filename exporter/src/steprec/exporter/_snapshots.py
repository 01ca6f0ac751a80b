"""Snapshots as deltas over content-addressed messages: linear, not quadratic, in run length.

A history at step N holds O(N) messages; serialising, hashing or even walking all of them in
Python at every step costs O(N²) over a run. Here each message is serialised and hashed once,
its JSON is sent once per run, and a snapshot says only "keep the first k references of the
previous snapshot, then append these". What a step pays is its new messages plus one C-speed
identity comparison of the history with the one seen before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import TypeAdapter
from pydantic_ai.messages import ModelMessage

from ._history import answer_calls

_MESSAGE = TypeAdapter(ModelMessage)


@dataclass(frozen=True)
class SnapshotDelta:
    """What goes on the wire for one snapshot (see `_records.snapshot`)."""

    base_index: int | None
    keep: int
    append_refs: bytes
    new_messages: list[str]
    history: Keyed

    @property
    def refs(self) -> tuple[bytes, ...]:
        return self.history.refs


def _key(message: ModelMessage) -> tuple[bytes, str]:
    text = _MESSAGE.dump_json(message).decode()
    return hashlib.sha256(text.encode()).digest(), text


def _fold(
    messages: Sequence[ModelMessage],
    refs: list[bytes],
    texts: list[str],
    open_calls: set[str] | None,
    known: dict[int, tuple[bytes, str]],
) -> set[str] | None:
    """Append each message's key (from `known` by identity, else serialised) and fold it into the open tool
    calls; returns them, or None once a message answered a call never made."""
    for message in messages:
        digest, text = known.get(id(message)) or _key(message)
        refs.append(digest)
        texts.append(text)
        if open_calls is not None and not answer_calls(open_calls, message):
            open_calls = None
    return open_calls


@dataclass
class _Scanned:
    """The settled history the last call walked: its message objects (held, so they stay what they
    were), their keys, and the tool calls still open after them (None once one was answered that
    was never made: no extension of such a history is settled).

    Its lists only ever grow (a rewritten history starts a new `_Scanned`), so a `Keyed` can hold
    their first n entries as a view instead of a copy.
    """

    messages: list[ModelMessage] = field(default_factory=list)
    refs: list[bytes] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    open_calls: set[str] | None = field(default_factory=set)

    def shared_prefix(self, messages: list[ModelMessage]) -> int:
        """How many leading messages of `messages` were walked already (the same objects, or equal ones)."""
        n = len(self.messages)
        if len(messages) >= n and messages[:n] == self.messages:  # list equality tries identity first, in C
            return n
        return 0

    def by_identity(self) -> dict[int, tuple[bytes, str]]:
        return {id(m): key for m, key in zip(self.messages, zip(self.refs, self.texts, strict=True), strict=True)}


@dataclass(frozen=True)
class Keyed:
    """A history with each message's digest and JSON, and whether all its tool work is settled.

    The settled messages are the first `count` of a scan, held as a view (its lists only grow, so later
    calls cannot change what this holds); the provisional ones follow in `tail_*`. Copying the history's
    keys instead cost every step time in the length of the run.
    """

    scan: _Scanned
    count: int
    tail_refs: tuple[bytes, ...]
    tail_texts: tuple[str, ...]
    settled: bool

    def __len__(self) -> int:
        return self.count + len(self.tail_refs)

    def refs_from(self, start: int) -> list[bytes]:
        return self.scan.refs[start : self.count] + list(self.tail_refs[max(start - self.count, 0) :])

    def texts_from(self, start: int) -> list[str]:
        return self.scan.texts[start : self.count] + list(self.tail_texts[max(start - self.count, 0) :])

    @property
    def refs(self) -> tuple[bytes, ...]:
        return tuple(self.refs_from(0))

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(self.texts_from(0))

    def common_prefix(self, other: Keyed) -> int:
        """How many leading references this history shares with `other`: in the time their difference
        takes when both are views of one scan, else in the time of their length."""
        shared = min(self.count, other.count) if other.scan is self.scan else 0
        mine, theirs = self.refs_from(shared), other.refs_from(shared)
        differ = (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b)
        return shared + next(differ, min(len(mine), len(theirs)))


@dataclass
class SnapshotEncoder:
    """Per-run state that turns message lists into `SnapshotDelta`s."""

    _scanned: _Scanned = field(default_factory=_Scanned)
    _sent: set[bytes] = field(default_factory=set)
    _previous: Keyed | None = None
    _previous_index: int | None = None

    def keyed(
        self, messages: list[ModelMessage], *, fresh: bool = False, provisional: Sequence[ModelMessage] = ()
    ) -> Keyed:
        """Digest, JSON and settledness of `messages` followed by `provisional`, walking only what was not
        walked before.

        `fresh` walks everything again, to catch messages edited in place. `provisional` messages are
        not in the run's history yet (a tool-return request folded in ahead of the graph) and
        pydantic-ai still stamps them when it appends them, so they are keyed without being kept:
        the next call sees their final content.
        """
        known: dict[int, tuple[bytes, str]] = {}
        if fresh or not (done := self._scanned.shared_prefix(messages)):
            if not fresh:  # rewritten (a history processor, say): messages kept from before need no new JSON
                known = self._scanned.by_identity()
            self._scanned, done = _Scanned(), 0
        scanned = self._scanned
        scanned.messages += messages[done:]
        scanned.open_calls = _fold(messages[done:], scanned.refs, scanned.texts, scanned.open_calls, known)
        open_calls = scanned.open_calls
        tail_refs: list[bytes] = []
        tail_texts: list[str] = []
        if provisional:
            open_calls = _fold(
                provisional, tail_refs, tail_texts, set(open_calls) if open_calls is not None else None, {}
            )
        return Keyed(
            scanned, len(scanned.refs), tuple(tail_refs), tuple(tail_texts), open_calls is not None and not open_calls
        )

    def is_previous(self, keyed: Keyed) -> bool:
        """Whether `keyed` holds the same references as the last snapshot committed."""
        previous = self._previous
        if previous is None:
            return not len(keyed)
        return len(previous) == len(keyed) == keyed.common_prefix(previous)

    def encode(self, keyed: Keyed) -> SnapshotDelta:
        """The delta of a keyed history against the previous snapshot; call `commit` once it is emitted."""
        previous = self._previous
        keep = keyed.common_prefix(previous) if previous is not None else 0
        appended = keyed.refs_from(keep)
        new_messages = []
        announced = set()
        for digest, text in zip(appended, keyed.texts_from(keep), strict=True):
            if digest not in self._sent and digest not in announced:
                announced.add(digest)
                new_messages.append(text)
        return SnapshotDelta(
            base_index=self._previous_index if keep else None,
            keep=keep,
            append_refs=b"".join(appended),
            new_messages=new_messages,
            history=keyed,
        )

    def forget(self) -> None:
        """Assume the recorder holds nothing of this run: the next delta is whole, with every message."""
        self._sent.clear()
        self._previous, self._previous_index = None, None

    def commit(self, snapshot_index: int, delta: SnapshotDelta) -> None:
        self._sent.update(delta.history.refs_from(delta.keep))
        self._previous = delta.history
        self._previous_index = snapshot_index
