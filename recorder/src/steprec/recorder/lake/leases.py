"""A conversation head's compare-and-swap made atomic across the recorders of a lake.

A recorder decides a head write on what it reads from the lake and commits it later (conversations.py); two
recorders doing that for one conversation at once would both read revision *n* and both commit *n + 1*. So
in a lake each write first takes the conversation's lease in PostgreSQL (`steprec_lease`, one statement),
and gives it back once its rows are applied, so the next holder reads them. A lease left by a recorder that
died runs out after `LEASE_SECONDS`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import duckdb

from ..store.applier import StoreUnavailable
from .fleet import Fleet, sql_text

LEASE_SECONDS = 30.0
WAIT_SECONDS = 10.0
"""How long a write waits for another recorder's write of the same conversation before it is refused."""


class ConversationLeases:
    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    @contextmanager
    def held(self, conversation_id: str) -> Iterator[None]:
        """Hold the conversation's lease for the body; StoreUnavailable if it cannot be had within WAIT_SECONDS."""
        me, conversation = sql_text(self._fleet.recorder_id), sql_text(conversation_id)
        deadline, pause = time.monotonic() + WAIT_SECONDS, 0.005
        while not self._taken(conversation, me):
            if time.monotonic() > deadline:
                raise StoreUnavailable(f"conversation {conversation_id!r} is being written through another recorder")
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        try:
            yield
        finally:
            with suppress(duckdb.Error):  # left behind, it runs out by itself
                self._fleet.execute(
                    f"DELETE FROM steprec_conversation_leases WHERE conversation_id = {conversation}"
                    f" AND recorder_id = {me}"
                )

    def _taken(self, conversation: str, me: str) -> bool:
        """One try. The postgres extension runs every statement in a REPEATABLE READ transaction, so a rival
        recorder taking the same lease at the same instant makes PostgreSQL refuse ours with a serialization
        failure instead of waiting: that is the lease being held, not the catalog failing."""
        try:
            return self._fleet.one(f"SELECT steprec_lease({conversation}, {me}, {LEASE_SECONDS})") is not None
        except duckdb.Error as error:
            if "could not serialize" in str(error):
                return False
            raise StoreUnavailable(f"the lake's catalog cannot lease conversations now: {error}") from error
