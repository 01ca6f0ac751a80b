"""Opening a lake for a recorder: its DuckDB session, tables, views, fleet membership and write order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb

from ..querier.sql import install_views, lock_down
from ..store.sequence import FleetClock
from .fleet import Fleet, recorder_id
from .location import LakeLocation, sql_name
from .schema import create_tables
from .target import LakeTarget


@dataclass
class OpenedLake:
    connection: duckdb.DuckDBPyConnection
    name: str
    """What DuckDB calls the lake (its main database)."""
    target: LakeTarget
    fleet: Fleet | None
    """Run-id claims among the recorders of a PostgreSQL catalog; None for a file catalog (one recorder)."""
    sequence: FleetClock
    recorder_id: str

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.close()
        self.connection.close()


def open_lake(location: LakeLocation, data_dir: Path, memory_limit_mib: int) -> OpenedLake:
    """Attach the lake, create what it lacks, and lock the session down to it (and a spill folder)."""
    extensions = data_dir / "duckdb-extensions"
    connection, name = location.connect(extensions)
    try:
        spill = data_dir / "duckdb-spill"
        spill.mkdir(parents=True, exist_ok=True, mode=0o700)
        connection.execute(f"SET memory_limit = '{int(memory_limit_mib)}MiB'")
        # DuckLake retries a conflicting commit itself by replaying its changes on the newer snapshot; an UPDATE
        # replayed after maintenance moved the row it deleted left both versions (seen: runs rows twice after a
        # crash test). `on_conflict` redoes the whole transaction instead, its statements read the newer lake.
        connection.execute("SET ducklake_max_retry_count = 0")
        connection.execute("SET temp_directory = ?", [str(spill)])
        create_tables(connection)
        install_views(connection, lake=sql_name(name))
        me = recorder_id(data_dir)
        fleet = Fleet(location.postgres, me, extensions) if location.postgres else None
        lock_down(connection, allowed_directories=[location.data_path(), str(spill) + "/"])
    except BaseException:
        connection.close()
        raise
    target = LakeTarget(connection, name, me)
    return OpenedLake(connection, name, target, fleet, FleetClock(fleet.slot if fleet else 0), me)
