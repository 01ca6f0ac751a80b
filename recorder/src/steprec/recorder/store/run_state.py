"""What ingest remembers about a run: the reference stores' replay-suppression and retention rules,
and the budget that bounds how many runs' state is kept in memory."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from steprec.proto import wire

DEFAULT_RUN_STATE_BYTES = 64 << 20
_DIGEST_BYTES = sys.getsizeof(bytes(wire.DIGEST_SIZE))


def snapshot_key_sequence(key: str) -> int | None:
    """The `<int>:` prefix of a snapshot key, which StepRecorder makes monotonic per run."""
    prefix, separator, _ = key.partition(":")
    if not separator or not prefix.isdigit():
        return None
    return int(prefix)


def _entry_bytes(entry: tuple[int, str, str | None]) -> int:
    return sum(sys.getsizeof(item) for item in (entry, *entry) if item is not None)


@dataclass(slots=True)
class RunState:
    """What ingest must know about a run to accept, suppress or refuse its next record."""

    registration_id: str | None = None
    max_snapshots: int | None = None
    event_keys: set[str] = field(default_factory=set)
    effect_keys: set[str] = field(default_factory=set)
    retained: list[tuple[int, str, str | None]] = field(default_factory=list)
    """`(write_seq, state, key)` of the run's retained snapshots, oldest first."""
    retained_keys: Counter[str] = field(default_factory=Counter)
    """How many of `retained` carry each key. Every new snapshot asks whether its key is retained; scanning
    `retained` for it made a run's snapshots cost the recorder the square of their number."""
    high_water: int | None = None
    high_water_keys: set[str] = field(default_factory=set)
    last_index: int | None = None
    last_refs: tuple[bytes, ...] = ()
    chain_depth: int = 0
    known_digests: set[bytes] = field(default_factory=set)
    run_seq: int | None = None
    """The `write_seq` of the run's `runs` row, which its `run_endings` row carries (a tree read joins on it)."""
    ended: bool = False
    """A run-ending event was staged for the run: another one replaces it (`batch.supersede_endings`)."""
    last_sequence: int = 0
    """The write-ahead log entry that last touched the run: its state may be dropped once that is applied."""
    measured_bytes: int = 0
    """What `RunStates` counts the state and its run id as, since it last measured them."""
    _key_bytes: int = 0
    _retained_bytes: int = 0

    def add_event_key(self, key: str) -> bool:
        """Remember an event's key; False when it was seen before (a replay)."""
        return self._add_key(self.event_keys, key)

    def add_effect_key(self, key: str) -> bool:
        """Remember a tool-effect record's key; False when it was seen before (a replay)."""
        return self._add_key(self.effect_keys, key)

    def _add_key(self, keys: set[str], key: str) -> bool:
        if key in keys:
            return False
        keys.add(key)
        self._key_bytes += sys.getsizeof(key)
        return True

    def retain(self, write_seq: int, snapshot_state: str, key: str | None) -> list[int]:
        """Remember a new snapshot; returns the `write_seq`s of those the run's retention now drops."""
        if key is not None:
            self.note_snapshot_key(key)
        self.retained.append(entry := (write_seq, snapshot_state, key))
        self._retained_bytes += _entry_bytes(entry)
        if key is not None:
            self.retained_keys[key] += 1
        if not self.max_snapshots or len(self.retained) <= self.max_snapshots:
            return []
        keep = retained_snapshots(self.retained, self.max_snapshots)
        pruned = [seq for seq, _, _ in self.retained if seq not in keep]
        self.set_retained([entry for entry in self.retained if entry[0] in keep])
        return pruned

    def set_retained(self, entries: list[tuple[int, str, str | None]]) -> None:
        self.retained = entries
        self._retained_bytes = sum(map(_entry_bytes, entries))
        self.retained_keys = Counter(key for _, _, key in entries if key is not None)

    def memory_bytes(self) -> int:
        """What the state holds, as `sys.getsizeof` counts it, in time independent of the run's length.

        The digests of `last_refs` are among `known_digests`, counted there once.
        """
        containers = (self.event_keys, self.effect_keys, self.known_digests, self.high_water_keys, self.retained,
                      self.retained_keys)  # fmt: skip
        return (
            sys.getsizeof(self)
            + sum(map(sys.getsizeof, containers))
            + sys.getsizeof(self.last_refs)
            + sum(map(sys.getsizeof, self.high_water_keys))
            + (sys.getsizeof(self.registration_id) if self.registration_id is not None else 0)
            + len(self.known_digests) * _DIGEST_BYTES
            + self._key_bytes
            + self._retained_bytes
        )

    def seen_snapshot_key(self, key: str) -> bool:
        """The reference stores' rule: an `<int>:` key at or below the high-water mark, or any retained key.

        The mark counts pruned snapshots too, so pruning never lets an old replay back in; other
        keys suppress only while a snapshot carrying them is retained.
        """
        sequence = snapshot_key_sequence(key)
        at_or_below_mark = (
            sequence is not None
            and self.high_water is not None
            and (sequence < self.high_water or (sequence == self.high_water and key in self.high_water_keys))
        )
        return at_or_below_mark or key in self.retained_keys

    def note_snapshot_key(self, key: str) -> None:
        sequence = snapshot_key_sequence(key)
        if sequence is None:
            return
        if self.high_water is None or sequence > self.high_water:
            self.high_water, self.high_water_keys = sequence, {key}
        elif sequence == self.high_water:
            self.high_water_keys.add(key)


def retained_snapshots(snapshots: list[tuple[int, str, str | None]], keep: int) -> set[int]:
    """The reference's retention rule: the newest `keep`, plus the newest overall and the newest complete.

    The last two keep both read modes served even when the newest `keep` are all interrupted.
    """
    retained = {seq for seq, _, _ in snapshots[-keep:]}
    retained.add(snapshots[-1][0])
    complete = [seq for seq, state, _ in snapshots if state == "complete"]
    if complete:
        retained.add(complete[-1])
    return retained


class RunStates:
    """The runs whose state ingest keeps in memory, least recently written first, within `max_bytes`.

    A count of runs is no bound on memory: one run's keys can weigh more than thousands of short
    runs (the soak's load runs held 5,000 event keys, about 0.7 MiB, each). So each state is
    measured whenever a request touched it, and past the budget the least recently written states
    whose records are all applied are dropped; a run that returns is loaded again from the database.
    """

    def __init__(self, max_bytes: int = DEFAULT_RUN_STATE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._held = 0
        """The sum of every kept state's `measured_bytes`."""
        self._states: dict[str, RunState] = {}

    def __len__(self) -> int:
        return len(self._states)

    @property
    def bytes(self) -> int:
        """What the kept states hold, their run ids and the map itself."""
        return self._held + sys.getsizeof(self._states)

    def get(self, run_id: str) -> RunState | None:
        return self._states.get(run_id)

    def add(self, run_id: str, state: RunState) -> None:
        self.drop(run_id)
        self._states[run_id] = state
        self._measure(run_id, state)

    def drop(self, run_id: str) -> None:
        if (state := self._states.pop(run_id, None)) is not None:
            self._held -= state.measured_bytes

    def clear(self) -> None:
        self._states.clear()
        self._held = 0

    def touch(self, run_ids: Iterable[str], sequence: int | None) -> None:
        """Runs a request just wrote (logged as `sequence`, if anything was): most recent now, measured again."""
        for run_id in run_ids:
            state = self._states.pop(run_id)
            self._states[run_id] = state
            if sequence is not None:
                state.last_sequence = sequence
            self._measure(run_id, state)

    def forget_idle(self, applied: int, keep: set[str]) -> None:
        """Past the budget, drop the least recently written states, all of whose records are `applied`,
        down to nine tenths of it; never those in `keep` (the request at hand's runs), which may be
        over it by themselves. Only an applied state may go: loading it again reads the database."""
        if (held := self.bytes) <= self.max_bytes:
            return
        excess = held - self.max_bytes * 9 // 10
        idle = []
        for run_id, state in self._states.items():
            if excess <= 0:
                break
            if state.last_sequence <= applied and run_id not in keep:
                idle.append(run_id)
                excess -= state.measured_bytes
        for run_id in idle:
            self.drop(run_id)

    def _measure(self, run_id: str, state: RunState) -> None:
        size = state.memory_bytes() + sys.getsizeof(run_id)
        self._held += size - state.measured_bytes
        state.measured_bytes = size
