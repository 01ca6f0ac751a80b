"""`DuckDBStore`: a steprec database in one DuckDB file, put together from its parts.

The parts, in the order a record travels: the write path (`write_path.py`: validation against
run state, staging, the write-ahead log), the applier (`applier.py`, writing through
`duckdb_target.py`), the reads (`reads.py`) and prune (`prune.py`). This class opens the file,
wires them together and closes them; it holds no logic of its own beyond that.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import duckdb
import pyarrow as pa

from ..daemon.metrics import MemoryUse, Metrics
from ..ingest.decode import Refusal, StepRecord
from ..lake.freshness import LakeWatcher
from ..lake.handoff import RunHandoff
from ..lake.leases import ConversationLeases
from ..lake.location import LakeLocation
from ..lake.maintenance import LakeMaintainer
from ..lake.opening import open_lake
from ..lake.retry import CONFLICT_ATTEMPTS, is_conflict, on_conflict
from ..querier.sql import install_views, lock_down
from .applier import Applier, StoreUnavailable
from .browse import BrowseReads
from .connection import DEFAULT_MEMORY_LIMIT_MIB, fetch_one, open_database
from .conversations import ConversationWrites, list_summaries, read_head
from .duckdb_target import DuckDBTarget
from .media import DEFAULT_THRESHOLD, LocalMediaStore, MediaCodec, MediaStore
from .message_cache import DEFAULT_CACHE_BYTES, message_cache
from .prune import PruneResult, prune_runs
from .reads import Reads
from .run_state import DEFAULT_RUN_STATE_BYTES
from .schema import migrate
from .snapshot_choices import SnapshotChoices
from .stored_messages import StoredMessages
from .wal import WriteAheadLog
from .write_path import WritePath, load_filter


class DuckDBStore(BrowseReads):
    """A steprec database in one DuckDB file, or in a lake many recorders share (`lake=`): `ingest`, the reads
    (`Reads`, `BrowseReads`), conversation heads, `prune`, `close`."""

    def __init__(
        self,
        path: Path,
        *,
        fsync: bool = False,
        max_snapshots_per_run: int | None = None,
        memory_limit_mib: int = DEFAULT_MEMORY_LIMIT_MIB,
        media_threshold: int = DEFAULT_THRESHOLD,
        media_store: MediaStore | None = None,
        message_cache_bytes: int = DEFAULT_CACHE_BYTES,
        run_state_bytes: int = DEFAULT_RUN_STATE_BYTES,
        lake: LakeLocation | None = None,
        lake_maintain_seconds: int = 600,
    ) -> None:
        self.path = path
        """The DuckDB file, or in lake mode where it would be: its folder holds the log either way."""
        self._lake = open_lake(lake, path.parent, memory_limit_mib) if lake else None
        if self._lake is None:
            self._connection = open_database(path, memory_limit_mib)
            migrate(self._connection)
            install_views(self._connection)
            lock_down(self._connection)
            target = DuckDBTarget(self._connection)
        else:
            self._connection, target = self._lake.connection, self._lake.target
        self.metrics = Metrics()
        self._media = MediaCodec(media_store or LocalMediaStore(path.parent / "media", fsync=fsync),
                                 threshold=media_threshold)  # fmt: skip
        bodies = message_cache(message_cache_bytes)
        choices = SnapshotChoices()
        self._choices = choices
        self._wal = WriteAheadLog(path.parent / "wal", fsync=fsync)
        self._stored = StoredMessages(lambda: load_filter(self._connection, "SELECT digest FROM messages", bytes))
        self._applier = Applier(target, self._wal, self._stored, self.metrics, on_snapshots_changed=choices.changed)
        fleet = self._lake.fleet if self._lake else None
        self._handoff = RunHandoff(fleet, lambda: self._applier.applied) if fleet else None
        self._write = WritePath(
            self._connection, self._wal, self._applier, self._stored, self._media, bodies,
            run_state_bytes=run_state_bytes, max_snapshots_per_run=max_snapshots_per_run,
            sequence=self._lake.sequence if self._lake else None, handoff=self._handoff,
        )  # fmt: skip
        if self._handoff is not None:
            self._handoff.start(self._write.let_go)
        if self._lake is not None:  # other recorders' commits change what reads here must pick; files pile up
            self._watcher = LakeWatcher(self._connection, self._lake.name, self._lake.recorder_id, choices.changed_all)
            self._maintainer = LakeMaintainer(self._connection, self._lake.name, lake_maintain_seconds)
        Reads.__init__(self, self._connection, self._applier, lambda: self._wal.last_sequence, self._media, bodies,
                       choices)  # fmt: skip
        leases = ConversationLeases(fleet) if fleet else None
        self.conversations = ConversationWrites(self._connection, self._applier, self._write,
                                                lambda: self._wal.last_sequence,
                                                leases.held if leases else None)  # fmt: skip
        self._bodies = bodies

    def ingest(self, records: Iterable[StepRecord]) -> tuple[list[Refusal], int]:
        """Log one request's records as one entry (`WritePath.ingest`); the refusals and replays suppressed."""
        return self._write.ingest(records)

    def prune(
        self, *, started_before_ns: int | None, conversation_id: str | None, dry_run: bool = False
    ) -> PruneResult:
        """Remove whole runs (and their events, snapshots and tool effects), then unreferenced messages.

        Holds the ingest lock for its duration (`_prune`).
        """
        if started_before_ns is None and conversation_id is None:
            raise ValueError("prune needs an age or a conversation; refusing to remove every run")

        with self._write.lock:
            return self._prune(started_before_ns=started_before_ns, conversation_id=conversation_id, dry_run=dry_run)

    def delete_conversation(self, conversation_id: str, revision: int) -> PruneResult:
        """Remove a conversation's head and its runs in one transaction, if its revision is still `revision`
        (Conflict otherwise); messages and media others still refer to stay."""
        with self.conversations.exclusive(conversation_id), self._write.lock:
            return self._prune(started_before_ns=None, conversation_id=conversation_id, dry_run=False,
                               head_revision=revision)  # fmt: skip

    def _prune(self, **matching) -> PruneResult:
        """`prune_runs` with the write path's lock held: after everything acknowledged is applied, so it never
        races a write it cannot see; then every run's notion of which messages the store holds is dropped."""

        def forget(run_ids: list[str]) -> None:
            self._choices.changed_all()
            self._write.states.clear()
            self._stored.forget_applied()
            if self._handoff is not None:
                self._handoff.forget(run_ids)
                self._lake.fleet.forget_runs(run_ids)

        self._applier.wait_applied(self._wal.last_sequence, for_write=True)
        if self._lake is None:
            with self._connection.cursor() as cursor:
                return prune_runs(cursor, self._media.store, on_committed=forget, **matching)

        def attempt() -> PruneResult:  # deletes conflict with any other recorder's insert into the same table
            with self._connection.cursor() as cursor:
                return prune_runs(cursor, self._media.store, on_committed=forget, collect_messages=False, **matching)

        try:
            return on_conflict(attempt)
        except duckdb.Error as error:
            if not is_conflict(error):
                raise
            raise StoreUnavailable(f"the prune lost {CONFLICT_ATTEMPTS} commit races with other recorders") from error

    def get_conversation(self, conversation_id: str) -> tuple[dict, bytes] | None:
        """A conversation's summary and its messages' digests, or None."""
        with self.cursor() as cursor:
            return read_head(cursor, conversation_id)

    def list_conversations(self, *, query: str, limit: int, offset: int, archived: bool | None) -> list[dict]:
        with self.cursor() as cursor:
            return list_summaries(cursor, query=query, limit=limit, offset=offset, archived=archived)

    @property
    def pending_entries(self) -> int:
        return self._applier.pending_entries

    def memory_use(self) -> MemoryUse:
        """What each bounded memory holds now. Call it where ingest runs (the event loop): it reads ingest's state."""
        return MemoryUse(
            duckdb=int(fetch_one(self._connection, "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()")),
            message_cache=self._bodies.bytes,
            message_cache_entries=self._bodies.entries,
            run_state=self._write.states.bytes,
            run_states=len(self._write.states),
            assembly=sum(len(piece) for pieces in self._write.fragments.values() for piece in pieces.values()),
            filters=self._stored.nbytes + self._write.run_ids.nbytes,
            arrow=pa.total_allocated_bytes(),
        )

    def close(self) -> None:
        """Apply everything acknowledged, then close the log and the database."""
        if self._lake is not None:
            self._watcher.close()
            self._maintainer.close()
        self._applier.close()
        if self._handoff is not None:
            self._handoff.close(all_applied=self._applier.all_applied())
        with self._write.lock:
            self._wal.close(applied=self._applier.applied)
            if self._lake is not None:
                self._lake.close()
            else:
                self._connection.close()
