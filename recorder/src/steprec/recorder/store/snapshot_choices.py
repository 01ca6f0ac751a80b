"""Which snapshot row a read picks, remembered until the run's snapshots change.

Continuing a run asks "which row is the newest complete snapshot of run R" each time. The answer is
one small DuckDB statement, yet that statement was most of what the recorder spent on a repeated
`continue_run` (2.1 ms of a live recorder's answer, measured; the rows it then reads are cached by
write sequence already). It changes only when the applier commits a transaction that adds or prunes
one of R's snapshots, or when an admin prune removes runs, so the answer is kept and checked against
those commits instead of asked again.

Correctness rests on one order: the applier calls `changed` after its COMMIT and before it marks the
entries applied, and a read waits until everything acknowledged before it is applied before it calls
`choose`. So a read never gets an answer older than a commit it is owed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

ChoiceKey = tuple[str, bool, int | None]
"""(run_id, include_interrupted, snapshot_index): the arguments that decide which row a read picks."""

MAX_ANSWERS = 8_192
"""Answers kept (about 250 bytes each): the runs being continued lately."""
MAX_TRACKED_RUNS = 16_384
"""Runs whose last change is known exactly (about 200 bytes each); older changes count as `_floor`."""


class SnapshotChoices:
    """Answers of "which snapshot row" by run and arguments, each valid while its run is unchanged.

    Commits are numbered (`_epoch`). An answer carries the number current before its statement ran;
    it still holds while its run's last change is no later than that. A run's last change is known for
    the `max_tracked_runs` runs changed most recently; for any other run `_floor` bounds it from above,
    which only ever makes an answer look stale, never current. Thread-safe.
    """

    def __init__(self, max_answers: int = MAX_ANSWERS, max_tracked_runs: int = MAX_TRACKED_RUNS) -> None:
        self._max_answers = max_answers
        self._max_tracked_runs = max_tracked_runs
        self._lock = threading.Lock()
        self._epoch = 0
        self._floor = 0
        self._changes: OrderedDict[str, int] = OrderedDict()  # run_id -> epoch of its last change, oldest first
        self._answers: OrderedDict[ChoiceKey, tuple[int, int]] = OrderedDict()  # -> (epoch, write_seq)

    def choose(self, key: ChoiceKey, find: Callable[[], int | None]) -> int | None:
        """The write sequence of the row `find` picks for `key` (None: no such snapshot), kept or found now.

        `find` runs outside the lock; its answer is kept only if the run did not change since the epoch read
        before it, so an answer found while a commit landed is used once and not kept. "No such snapshot" is
        not kept: it is the rare answer (a wrong run id), and keeping it would let strangers fill the map.
        """
        with self._lock:
            epoch = self._epoch
            write_seq = self._kept(key)
        if write_seq is not None:
            return write_seq
        write_seq = find()
        if write_seq is not None:
            with self._lock:
                if self._last_change(key[0]) <= epoch:
                    self._answers[key] = (epoch, write_seq)
                    self._answers.move_to_end(key)
                    if len(self._answers) > self._max_answers:
                        self._answers.popitem(last=False)
        return write_seq

    def kept(self, key: ChoiceKey) -> int | None:
        """The write sequence kept for `key` if it still holds, else None; never asks DuckDB."""
        with self._lock:
            return self._kept(key)

    def _kept(self, key: ChoiceKey) -> int | None:
        kept = self._answers.get(key)
        if kept is None or kept[0] < self._last_change(key[0]):
            return None
        self._answers.move_to_end(key)
        return kept[1]

    def changed(self, run_ids: Iterable[str]) -> None:
        """A committed transaction added or pruned snapshots of these runs."""
        with self._lock:
            self._epoch += 1
            for run_id in run_ids:
                self._changes[run_id] = self._epoch
                self._changes.move_to_end(run_id)
            while len(self._changes) > self._max_tracked_runs:
                _, epoch = self._changes.popitem(last=False)
                self._floor = max(self._floor, epoch)

    def changed_all(self) -> None:
        """A committed transaction may have removed snapshots of any run (an admin prune)."""
        with self._lock:
            self._epoch += 1
            self._floor = self._epoch
            self._changes.clear()
            self._answers.clear()

    def _last_change(self, run_id: str) -> int:
        return self._changes.get(run_id, self._floor)
