"""Snapshots as deltas over content-addressed messages: linear, not quadratic, in run length.

A history at step N holds O(N) messages; sending or hashing all of them at
every step costs O(N²) over a run. Here each message object is serialised and
hashed once (cached by identity, holding a reference so the id stays unique),
its JSON is sent once per run, and a snapshot says only "keep the first k
references of the previous snapshot, then append these".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from pydantic import TypeAdapter
from pydantic_ai.messages import ModelMessage

_MESSAGE = TypeAdapter(ModelMessage)


@dataclass(frozen=True)
class SnapshotDelta:
    """What goes on the wire for one snapshot (see `_records.snapshot`)."""

    base_index: int | None
    keep: int
    append_refs: bytes
    new_messages: list[str]
    refs: tuple[bytes, ...]


def _common_prefix(a: tuple[bytes, ...], b: tuple[bytes, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class SnapshotEncoder:
    """Per-run state that turns message lists into `SnapshotDelta`s."""

    _digest_by_id: dict[int, tuple[ModelMessage, bytes, str]] = field(default_factory=dict)
    _sent: set[bytes] = field(default_factory=set)
    _previous_refs: tuple[bytes, ...] = ()
    _previous_index: int | None = None

    def _digest(self, message: ModelMessage, *, fresh: bool, cache: bool = True) -> tuple[bytes, str]:
        cached = None if fresh or not cache else self._digest_by_id.get(id(message))
        if cached is None:
            text = _MESSAGE.dump_json(message).decode()
            cached = (message, hashlib.sha256(text.encode()).digest(), text)
            if cache:
                self._digest_by_id[id(message)] = cached
        return cached[1], cached[2]

    def refs(self, messages: list[ModelMessage], *, fresh: bool = False) -> tuple[bytes, ...]:
        """The content references of `messages`; `fresh` re-serialises to catch in-place edits."""
        return tuple(self._digest(m, fresh=fresh)[0] for m in messages)

    @property
    def previous_refs(self) -> tuple[bytes, ...]:
        return self._previous_refs

    def encode(self, messages: list[ModelMessage], *, fresh: bool = False, provisional: int = 0) -> SnapshotDelta:
        """The delta of `messages` against the previous snapshot; call `commit` once it is emitted.

        The last `provisional` messages are not in the run's history yet (a
        tool-return request folded in ahead of the graph) and pydantic-ai still
        stamps them when it appends them, so they are serialised without being
        cached: the next snapshot sees their final content.
        """
        settled = len(messages) - provisional
        keyed = [self._digest(m, fresh=fresh, cache=i < settled) for i, m in enumerate(messages)]
        refs = tuple(digest for digest, _ in keyed)
        keep = _common_prefix(self._previous_refs, refs) if self._previous_index is not None else 0
        new_messages = []
        announced = set()
        for digest, text in keyed[keep:]:
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
        self._sent.update(delta.refs)
        self._previous_refs = delta.refs
        self._previous_index = snapshot_index
