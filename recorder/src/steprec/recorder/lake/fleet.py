"""What the recorders sharing a lake agree on through its PostgreSQL catalog: who each one is, and who
registered each run id.

DuckLake has no unique constraints, and a run's registration may reach any recorder: two recorders checking
only their own state (and the lake, which lags each one's log by the applier's linger) would both accept the
same explicit run id. A registration therefore claims its run id in one PostgreSQL statement
(`steprec_claim_run`, INSERT ... ON CONFLICT), which answers with the registration holding it: ours, or the
earlier one's, which the write path refuses with the agent's ValueError. Each recorder also takes a slot
number there (`steprec_recorders`), which makes its `write_seq` values unique across the fleet (`sequence.py`).

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

_SETUP = [
    "CREATE TABLE IF NOT EXISTS steprec_recorders (slot integer PRIMARY KEY, recorder_id text UNIQUE NOT NULL,"
    " joined_at timestamptz NOT NULL DEFAULT now())",
    "CREATE TABLE IF NOT EXISTS steprec_run_claims (run_id text PRIMARY KEY, registration_id text NOT NULL,"
    " recorder_id text NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now())",
    # One statement each, so a claim is atomic however many recorders race for it; functions because the
    # postgres extension reads results through COPY (SELECT ...), which cannot hold an INSERT.
    "CREATE OR REPLACE FUNCTION steprec_claim_run(run text, registration text, recorder text) RETURNS text"
    " LANGUAGE sql VOLATILE AS $$ INSERT INTO steprec_run_claims (run_id, registration_id, recorder_id)"
    " VALUES (run, registration, recorder) ON CONFLICT (run_id) DO UPDATE SET run_id = excluded.run_id"
    " RETURNING registration_id $$",
    "CREATE OR REPLACE FUNCTION steprec_join(recorder text) RETURNS integer LANGUAGE sql VOLATILE AS $$"
    " INSERT INTO steprec_recorders (slot, recorder_id) SELECT coalesce(max(slot) + 1, 0), recorder"
    " FROM steprec_recorders ON CONFLICT (recorder_id) DO UPDATE SET recorder_id = excluded.recorder_id"
    " RETURNING slot $$",
]


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


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
            self._connection.execute(f"ATTACH {_text(postgres)} AS fleet (TYPE postgres)")
            for statement in _SETUP:
                self._execute(statement)
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
                return self._one(f"SELECT steprec_join({_text(recorder)})")
            except duckdb.Error as error:
                if "steprec_recorders_pkey" not in str(error):
                    raise
        raise ValueError("no free recorder slot could be taken")

    def claim_run(self, run_id: str, registration_id: str) -> str:
        """The registration that holds `run_id` now: `registration_id` if it is the first (or a retry of it)."""
        return self._one(
            f"SELECT steprec_claim_run({_text(run_id)}, {_text(registration_id)}, {_text(self.recorder_id)})"
        )

    def forget_runs(self, run_ids: list[str]) -> None:
        """Release the claims of pruned runs (their ids stay single-use only while their records exist)."""
        for start in range(0, len(run_ids), 1000):
            chunk = ", ".join(_text(r) for r in run_ids[start : start + 1000])
            self._execute(f"DELETE FROM steprec_run_claims WHERE run_id IN ({chunk})")

    def close(self) -> None:
        self._connection.close()

    def _execute(self, statement: str) -> None:
        self._in_transaction("CALL postgres_execute('fleet', ?)", statement)

    def _one(self, query: str):
        return self._in_transaction("SELECT * FROM postgres_query('fleet', ?)", query)[0]

    def _in_transaction(self, call: str, statement: str):
        """One explicit DuckDB transaction per statement: without it the postgres extension leaves its
        PostgreSQL transaction open after postgres_query, holding the rows it wrote locked for every other
        recorder (seen: a second recorder's join waited for the first's forever)."""
        with self._lock:
            self._connection.execute("BEGIN")
            try:
                row = self._connection.execute(call, [statement]).fetchone()
                self._connection.execute("COMMIT")
            except BaseException:
                self._connection.execute("ROLLBACK")
                raise
            return row
