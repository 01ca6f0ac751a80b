"""Handing a run from one lake recorder to another when its agent reconnects elsewhere mid-run.

The write path keeps each run's state in memory (keys seen, the last snapshot's references) and runs ahead of
the lake by what its own log holds. A run whose records start arriving at another recorder must not be
staged there on what the lake shows until every record the first recorder acknowledged is in the lake, or a
replay is stored twice and a delta's base is missing; and the first recorder must let go of its state, or the
run coming back to it is staged on stale keys. Both go through the catalog's PostgreSQL:

- Each recorder *holds* the runs it writes (`steprec_hold_runs`, one statement per request that brings runs
  it has no state for; it claims registrations in the same statement). Taking a run another slot held
  records that slot (and any it was itself still waiting for) in the run's `waits_for`.
- Every `BEAT_SECONDS` each recorder reads PostgreSQL's clock (*t*), drops its state of the runs taken from
  it, notes its log's last entry, and once that entry is applied publishes `applied_through_us = t`:
  everything it acknowledged before *t* is in the lake, and it holds no state of a run taken before *t*.
- The taker reads the clock after its take committed (*T*) and refuses the run's records as UNAVAILABLE
  (the agent's journal sends them again) until every slot in `waits_for` has published a time past *T*;
  then it loads the run's state from the lake and marks the move settled.

A recorder killed with the run's records in its log publishes nothing until it is restarted and has
applied them, so the run waits for it; a recorder that stops cleanly publishes "everything" last.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import duckdb

from ..store.applier import StoreUnavailable
from .fleet import Fleet, sql_text

logger = logging.getLogger(__name__)

BEAT_SECONDS = 0.2
MOVES_WINDOW_US = 600_000_000
"""How far back each beat looks for runs taken from this recorder (10 minutes): a take commits after the
clock it was stamped with, so one beat may miss it and the next must still find it."""
EVERYTHING_US = 1 << 62
"""What a recorder that stopped with its whole log applied publishes: no run waits for it."""


@dataclass(frozen=True)
class Holding:
    """What holding a request's runs answered: each run's registration, and the runs to load from the lake."""

    registrations: dict[str, str | None]
    moved_here: set[str]


@dataclass
class _Move:
    waits_for: tuple[int, ...]
    after_us: int
    """PostgreSQL's clock after the take committed: each slot waited for must publish a time past it."""


class RunHandoff:
    """Holds runs for the write path and keeps this recorder's side of the handoff (the beat thread)."""

    def __init__(self, fleet: Fleet, applied: Callable[[], int]) -> None:
        """`applied()` is the applier's position; the beat starts with `start`."""
        self._fleet = fleet
        self._let_go: Callable[[set[str]], int] = lambda runs: 0
        self._applied = applied
        self._lock = threading.Lock()
        self._moves: dict[str, _Move] = {}
        """Runs taken from other recorders whose records wait here."""
        self._published: dict[int, int] = {}
        """Each slot's `applied_through_us`, as the last beat read it."""
        self._candidates: list[tuple[int, int]] = []
        """`(clock, log sequence)` of beats whose entries are not all applied yet, oldest first."""
        self._seen_moves: dict[tuple[str, int], None] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_forever, name="steprec-lake-handoff", daemon=True)

    def start(self, let_go: Callable[[set[str]], int]) -> None:
        """Beat from now on. `let_go(run_ids)` drops the write path's state of runs taken from here (under its
        lock) and answers its log's last sequence."""
        self._let_go = let_go
        self._thread.start()

    def hold(self, registrations: dict[str, str | None]) -> Holding:
        """Hold these runs (this request brings them and the write path has no state of them), claiming the
        registrations given. Called under the write path's lock.

        Raises StoreUnavailable while a run taken from another recorder waits for that recorder's log to reach
        the lake, or when PostgreSQL cannot be reached: nothing of the request is staged, the agent retries.
        """
        try:
            held: dict[str, str | None] = {}
            taken, fresh = {}, []
            for run, registration, waits in self._fleet.hold_runs(registrations):
                held[run] = registration
                if waits:
                    taken[run] = tuple(waits)
                elif waits is not None:  # new to the lake (again, if a prune removed it while it waited here)
                    fresh.append(run)
            now = self._fleet.clock_us() if taken else 0  # after the take committed: see the module's docstring
            with self._lock:
                self._moves.update((run, _Move(waits, now)) for run, waits in taken.items())
                for run in fresh:
                    self._moves.pop(run, None)
                moves = {run: self._moves[run] for run in registrations.keys() & self._moves.keys()}
            for run, move in moves.items():
                late = [slot for slot in move.waits_for if self._published.get(slot, 0) <= move.after_us]
                if late:
                    raise StoreUnavailable(
                        f"run {run!r} moved here from another recorder (slot {late[0]}), whose log is not all in"
                        " the lake yet"
                    )
            if moves:
                self._fleet.execute(
                    "UPDATE steprec_run_claims SET waits_for = '{}' WHERE slot = "
                    f"{self._fleet.slot} AND run_id IN ({', '.join(map(sql_text, moves))})"
                )
                with self._lock:
                    for run in moves:
                        self._moves.pop(run, None)
        except duckdb.Error as error:
            raise StoreUnavailable(f"the lake's catalog cannot hold runs now: {error}") from error
        return Holding(held, set(moves))

    def beat(self) -> None:
        """One beat: let go of runs taken from here, publish how far the log is applied, read the others'."""
        fleet = self._fleet
        now = fleet.clock_us()
        taken = fleet.all(
            f"SELECT run_id, since_us FROM steprec_run_claims WHERE {fleet.slot} = ANY(waits_for)"
            f" AND since_us > {now - MOVES_WINDOW_US}"
        )
        new = [(run, since) for run, since in taken if (run, since) not in self._seen_moves]
        for move in new:
            self._seen_moves[move] = None
        with self._lock:  # a run taken on from here is no longer one to wait for
            for run, _ in new:
                self._moves.pop(run, None)
        while len(self._seen_moves) > 4 * max(len(taken), 1024):
            del self._seen_moves[next(iter(self._seen_moves))]
        self._candidates.append((now, self._let_go({run for run, _ in new})))
        applied = self._applied()
        through = None
        while self._candidates and self._candidates[0][1] <= applied:
            through = self._candidates.pop(0)[0]
        if through is not None:
            self.publish(through)
        self._published = dict(fleet.all("SELECT slot, applied_through_us FROM steprec_recorders"))

    def publish(self, through_us: int) -> None:
        self._fleet.execute(
            f"UPDATE steprec_recorders SET applied_through_us = {int(through_us)} WHERE slot = {self._fleet.slot}"
        )

    def forget(self, run_ids: list[str]) -> None:
        """Pruned runs: nothing waits for them any more."""
        with self._lock:
            for run in run_ids:
                self._moves.pop(run, None)

    def _beat_forever(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            try:
                self.beat()
            except duckdb.Error as error:  # the catalog is away for a moment: beat again next time
                logger.warning("cannot reach the lake's catalog for the run handoff: %s", error)

    def close(self, *, all_applied: bool) -> None:
        """Stop beating; with the whole log applied, publish that no run need wait for this recorder."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if all_applied:
            try:
                self.publish(EVERYTHING_US)
            except duckdb.Error as error:
                logger.warning("could not tell the lake this recorder's log is applied: %s", error)
