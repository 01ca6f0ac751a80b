"""Snapshots as deltas over content-addressed messages: linear, not quadratic, in run length.

A history at step N holds O(N) messages; serialising, hashing or even walking all of them in
Python at every step costs O(N²) over a run. Here each message is serialised and hashed once,
its JSON is sent once per run, and a snapshot says only "keep the first k references of the
previous snapshot, then append these". What a step pays is its new messages plus one C-speed
identity comparison of the history with the one seen before.
"""

from __future__ import annotations

import hashlib
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
    refs: tuple[bytes, ...]


@dataclass(frozen=True)
class Keyed:
    """A history with each message's digest and JSON, and whether all its tool work is settled."""

    refs: tuple[bytes, ...]
    texts: tuple[str, ...]
    settled: bool


def _key(message: ModelMessage) -> tuple[bytes, str]:
    text = _MESSAGE.dump_json(message).decode()
    return hashlib.sha256(text.encode()).digest(), text


def _fold(
    messages: list[ModelMessage],
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
    was never made: no extension of such a history is settled)."""

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


@dataclass
class SnapshotEncoder:
    """Per-run state that turns message lists into `SnapshotDelta`s."""

    _scanned: _Scanned = field(default_factory=_Scanned)
    _sent: set[bytes] = field(default_factory=set)
    _previous_refs: tuple[bytes, ...] = ()
    _previous_index: int | None = None

    def keyed(self, messages: list[ModelMessage], *, fresh: bool = False, provisional: int = 0) -> Keyed:
        """Digest, JSON and settledness of `messages`, walking only what was not walked before.

        `fresh` walks everything again, to catch messages edited in place. The last `provisional`
        messages are not in the run's history yet (a tool-return request folded in ahead of the
        graph) and pydantic-ai still stamps them when it appends them, so they are keyed without
        being kept: the next call sees their final content.
        """
        settled = len(messages) - provisional
        known: dict[int, tuple[bytes, str]] = {}
        if fresh or not (done := self._scanned.shared_prefix(messages[:settled])):
            if not fresh:  # rewritten (a history processor, say): messages kept from before need no new JSON
                known = self._scanned.by_identity()
            self._scanned, done = _Scanned(), 0
        scanned = self._scanned
        scanned.messages += messages[done:settled]
        scanned.open_calls = _fold(messages[done:settled], scanned.refs, scanned.texts, scanned.open_calls, known)
        refs, texts, open_calls = list(scanned.refs), list(scanned.texts), scanned.open_calls
        if provisional and open_calls is not None:
            open_calls = set(open_calls)
        open_calls = _fold(messages[settled:], refs, texts, open_calls, {})
        return Keyed(tuple(refs), tuple(texts), settled=open_calls is not None and not open_calls)

    @property
    def previous_refs(self) -> tuple[bytes, ...]:
        return self._previous_refs

    def encode(self, keyed: Keyed) -> SnapshotDelta:
        """The delta of a keyed history against the previous snapshot; call `commit` once it is emitted."""
        refs, previous = keyed.refs, self._previous_refs
        if self._previous_index is None:
            keep = 0
        elif refs[: len(previous)] == previous:
            keep = len(previous)
        else:
            keep = next((i for i, (a, b) in enumerate(zip(previous, refs, strict=False)) if a != b), len(refs))
        new_messages = []
        announced = set()
        for digest, text in zip(refs[keep:], keyed.texts[keep:], strict=True):
            if digest not in self._sent and digest not in announced:
                announced.add(digest)
                new_messages.append(text)
        return SnapshotDelta(
            base_index=self._previous_index if keep else None,
            keep=keep,
            append_refs=b"".join(refs[keep:]),
            new_messages=new_messages,
            refs=refs,
        )

    def forget(self) -> None:
        """Assume the recorder holds nothing of this run: the next delta is whole, with every message."""
        self._sent.clear()
        self._previous_refs, self._previous_index = (), None

    def commit(self, snapshot_index: int, delta: SnapshotDelta) -> None:
        self._sent.update(delta.refs[delta.keep :])
        self._previous_refs = delta.refs
        self._previous_index = snapshot_index
