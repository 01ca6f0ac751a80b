"""What ingest remembers about a run: the reference stores' replay-suppression and retention rules."""

from __future__ import annotations

from dataclasses import dataclass, field


def snapshot_key_sequence(key: str) -> int | None:
    """The `<int>:` prefix of a snapshot key, which StepRecorder makes monotonic per run."""
    prefix, separator, _ = key.partition(":")
    if not separator or not prefix.isdigit():
        return None
    return int(prefix)


@dataclass
class RunState:
    """What ingest must know about a run to accept, suppress or refuse its next record."""

    registration_id: str | None = None
    max_snapshots: int | None = None
    event_keys: set[str] = field(default_factory=set)
    effect_keys: set[str] = field(default_factory=set)
    retained: list[tuple[int, str, str | None]] = field(default_factory=list)
    """`(write_seq, state, key)` of the run's retained snapshots, oldest first."""
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
        return at_or_below_mark or any(retained_key == key for _, _, retained_key in self.retained)

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
