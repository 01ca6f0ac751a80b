"""What the recorders sharing a lake agree on through its PostgreSQL catalog: who each one is, who registered
each run id, and which recorder writes each run now.

DuckLake has no unique constraints, and a run's registration may reach any recorder: two recorders checking
only their own state (and the lake, which lags each one's log by the applier's linger) would both accept the
same explicit run id. A registration therefore claims its run id in one PostgreSQL statement
(`steprec_hold_runs`, INSERT ... ON CONFLICT), which answers with the registration holding it: ours, or the
earlier one's, which the write path refuses with the agent's ValueError. The same statement records which
recorder holds the run (`handoff.py`). Each recorder also takes a slot number there (`steprec_recorders`),
which makes its `write_seq` values unique across the fleet (`sequence.py`).

Statements go through DuckDB's postgres extension on a connection of its own, never the lake's.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import duckdb

from .extensions import connect_with_extensions
from .location import redacted

MAX_SLOTS = 1024
"""Recorders a lake can have had (slots are kept for a recorder's data folder, reused on its restarts)."""

_TAKES = (
    "c.slot IS DISTINCT FROM me AND (c.registration_id IS NULL OR excluded.registration_id IS NULL"
    " OR c.registration_id = excluded.registration_id)"
)
"""In `steprec_hold_runs`' conflict arm: the run is held by another slot, and this is not a rival registration."""

_SETUP = [
    "CREATE TABLE IF NOT EXISTS steprec_recorders (slot integer PRIMARY KEY, recorder_id text UNIQUE NOT NULL,"
    " joined_at timestamptz NOT NULL DEFAULT now())",
    "CREATE TABLE IF NOT EXISTS steprec_run_claims (run_id text PRIMARY KEY, registration_id text NOT NULL,"
    " recorder_id text NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now())",
    # One statement each, so a claim is atomic however many recorders race for it; functions because the
    # postgres extension reads results through COPY (SELECT ...), which cannot hold an INSERT.
    "CREATE OR REPLACE FUNCTION steprec_join(recorder text) RETURNS integer LANGUAGE sql VOLATILE AS $$"
    " INSERT INTO steprec_recorders (slot, recorder_id) SELECT coalesce(max(slot) + 1, 0), recorder"
    " FROM steprec_recorders ON CONFLICT (recorder_id) DO UPDATE SET recorder_id = excluded.recorder_id"
    " RETURNING slot $$",
    # Who writes each run now (handoff.py): the slot holding it, the slots whose logs a new holder waits for,
    # and when it took the run (microseconds of PostgreSQL's clock). A run taken without a registration in
    # the same request has none yet.
    "ALTER TABLE steprec_run_claims ALTER COLUMN registration_id DROP NOT NULL",
    "ALTER TABLE steprec_run_claims ADD COLUMN IF NOT EXISTS slot integer",
    "ALTER TABLE steprec_run_claims ADD COLUMN IF NOT EXISTS waits_for integer[] NOT NULL DEFAULT '{}'",
    "ALTER TABLE steprec_run_claims ADD COLUMN IF NOT EXISTS since_us bigint NOT NULL DEFAULT 0",
    "CREATE INDEX IF NOT EXISTS steprec_run_claims_moves ON steprec_run_claims USING gin (waits_for)",
    "ALTER TABLE steprec_recorders ADD COLUMN IF NOT EXISTS applied_through_us bigint NOT NULL DEFAULT 0",
    # A conversation head's compare-and-swap holds a lease (leases.py): free, expired, or this recorder's already.
    "CREATE TABLE IF NOT EXISTS steprec_conversation_leases (conversation_id text PRIMARY KEY, recorder_id text"
    " NOT NULL, until timestamptz NOT NULL)",
    "CREATE OR REPLACE FUNCTION steprec_lease(conversation text, recorder text, seconds double precision)"
    " RETURNS text LANGUAGE sql VOLATILE AS $$ INSERT INTO steprec_conversation_leases AS l VALUES"
    " (conversation, recorder, clock_timestamp() + seconds * interval '1 second') ON CONFLICT (conversation_id)"
    " DO UPDATE SET recorder_id = excluded.recorder_id, until = excluded.until"
    " WHERE l.until < clock_timestamp() OR l.recorder_id = excluded.recorder_id RETURNING recorder_id $$",
    # Hold runs for recorder `me` (and claim the registrations given, NULL for none) in one statement: a run
    # another slot held is taken over, and the new holder must wait for that slot's log, and for the logs an
    # unsettled earlier move was waiting for; answers each run's registration and, for a taken run, those slots.
    # A rival registration (another Agent.run with the same explicit id) takes nothing: it is refused.
    "CREATE OR REPLACE FUNCTION steprec_hold_runs(me integer, recorder text, runs text[], registrations text[])"
    " RETURNS TABLE(run text, registration text, waits integer[]) LANGUAGE sql VOLATILE AS $$"
    " WITH clock AS (SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint AS now_us),"
    " held AS (INSERT INTO steprec_run_claims AS c (run_id, registration_id, recorder_id, slot, since_us)"
    " SELECT r.run, r.registration, recorder, me, clock.now_us"
    " FROM unnest(runs, registrations) AS r(run, registration), clock"
    " ON CONFLICT (run_id) DO UPDATE SET registration_id = coalesce(c.registration_id, excluded.registration_id),"
    f" waits_for = CASE WHEN {_TAKES} THEN"
    " array(SELECT DISTINCT s FROM unnest(c.waits_for || c.slot) AS s WHERE s IS NOT NULL AND s <> me)"
    " ELSE c.waits_for END,"
    f" since_us = CASE WHEN {_TAKES} THEN excluded.since_us ELSE c.since_us END,"
    f" slot = CASE WHEN {_TAKES} THEN me ELSE c.slot END"
    " RETURNING c.run_id, c.registration_id, c.waits_for, c.since_us)"
    " SELECT held.run_id, held.registration_id, CASE WHEN held.since_us = clock.now_us THEN held.waits_for END"
    " FROM held, clock $$",
]


def sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _text_array(values) -> str:
    items = ", ".join("NULL" if value is None else sql_text(value) for value in values)
    return f"ARRAY[{items}]::text[]"


def recorder_id(data_dir: Path) -> str:
    """This recorder's lasting name, kept in its data folder: its log and its slot belong to it across restarts."""
    path = data_dir / "recorder-id"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text(uuid.uuid4().hex + "\n")
    return path.read_text().strip()


class Fleet:
    """Run-id claims and recorder slots in the lake's PostgreSQL catalog database."""

    def __init__(self, postgres: str, recorder: str, extension_dir: Path) -> None:
        self.recorder_id = recorder
        self._lock = threading.Lock()
        self._connection = connect_with_extensions(extension_dir)
        try:
            self._connection.execute(f"ATTACH {sql_text(postgres)} AS fleet (TYPE postgres)")
            for statement in _SETUP:
                self.execute(statement)
            self.slot = self._join(recorder)
        except duckdb.Error as error:
            raise ValueError(
                f"cannot use the lake's PostgreSQL {redacted(postgres)!r}: {redacted(str(error))}"
            ) from None
        if self.slot >= MAX_SLOTS:
            raise ValueError(f"the lake has had {MAX_SLOTS} recorders already; no slot is left for {recorder}")

    def _join(self, recorder: str) -> int:
        """This recorder's slot; two recorders joining at once may pick the same free slot, and one retries."""
        for _ in range(MAX_SLOTS):
            try:
                return self.one(f"SELECT steprec_join({sql_text(recorder)})")
            except duckdb.Error as error:
                if "steprec_recorders_pkey" not in str(error):
                    raise
        raise ValueError("no free recorder slot could be taken")

    def hold_runs(self, registrations: dict[str, str | None]) -> list[tuple[str, str | None, list[int] | None]]:
        """Hold these runs for this recorder and claim the registrations given (`steprec_hold_runs`): each run's
        registration now, and for a run just taken from another recorder the slots whose logs must reach the
        lake before its records are staged here (empty for a run new to the lake, None for one held already)."""
        runs, claimed = zip(*registrations.items(), strict=True)
        return self.all(
            f"SELECT * FROM steprec_hold_runs({self.slot}, {sql_text(self.recorder_id)}, {_text_array(runs)},"
            f" {_text_array(claimed)})"
        )

    def clock_us(self) -> int:
        """PostgreSQL's clock, in microseconds: the one clock every recorder of the lake reads."""
        return self.one("SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint")

    def forget_runs(self, run_ids: list[str]) -> None:
        """Release the claims of pruned runs (their ids stay single-use only while their records exist)."""
        for start in range(0, len(run_ids), 1000):
            chunk = ", ".join(sql_text(r) for r in run_ids[start : start + 1000])
            self.execute(f"DELETE FROM steprec_run_claims WHERE run_id IN ({chunk})")

    def close(self) -> None:
        self._connection.close()

    def execute(self, statement: str) -> None:
        self._in_transaction("CALL postgres_execute('fleet', ?)", statement, all_rows=False)

    def one(self, query: str):
        """The first column of the first row `query` answers (None for none)."""
        rows = self.all(query)
        return rows[0][0] if rows else None

    def all(self, query: str) -> list[tuple]:
        return self._in_transaction("SELECT * FROM postgres_query('fleet', ?)", query, all_rows=True)

    def _in_transaction(self, call: str, statement: str, *, all_rows: bool):
        """One explicit DuckDB transaction per statement: without it the postgres extension leaves its
        PostgreSQL transaction open after postgres_query, holding the rows it wrote locked for every other
        recorder (seen: a second recorder's join waited for the first's forever)."""
        with self._lock:
            self._connection.execute("BEGIN")
            try:
                result = self._connection.execute(call, [statement])
                rows = result.fetchall() if all_rows else []
                self._connection.execute("COMMIT")
            except BaseException:
                self._connection.execute("ROLLBACK")
                raise
            return rows
