"""Retrying a lake transaction that lost a race with another recorder's commit."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

import duckdb

T = TypeVar("T")

CONFLICT_ATTEMPTS = 20


LOST_RACE = ("transaction conflict", "ducklake_snapshot_pkey", "could not serialize access", "deadlock detected")
"""How a lost commit race reads: DuckLake's own conflict check; two commits taking the same next snapshot id in
the catalog; PostgreSQL refusing a concurrent update of the same catalog row; PostgreSQL aborting one of two
commits that each wait on rows the other updates (a prune's deletes of inlined rows against another recorder's
round), which it ends by rolling that one back."""


def is_conflict(error: BaseException) -> bool:
    """Whether another recorder's commit got there first: then the whole transaction may simply be done again."""
    return isinstance(error, duckdb.Error) and any(sign in str(error).lower() for sign in LOST_RACE)


def on_conflict(attempt: Callable[[], T]) -> T:
    """`attempt()` again (after a short random pause) while it fails with a commit conflict; each attempt is
    one whole transaction that it ends either way, so a retry redoes it against the newer lake.

    Appends never conflict in DuckLake; the rare deletes and updates (endings superseded, fragments assembled,
    conversation heads replaced) can, with any concurrent insert into the same table.
    """
    for tries in range(CONFLICT_ATTEMPTS):
        try:
            return attempt()
        except duckdb.Error as error:  # the attempt has ended its transaction (rolled back or closed its cursor)
            if not is_conflict(error) or tries == CONFLICT_ATTEMPTS - 1:
                raise
            time.sleep(random.uniform(0.005, 0.05) * (tries + 1))
    raise AssertionError("unreachable")
