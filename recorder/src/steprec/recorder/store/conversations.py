"""Conversation heads: a conversation's authoritative history and its browser metadata (docs/conversations.md).

Every write is a compare-and-swap on the conversation's content revision, as pydantic-ai-harness's
`SqliteConversationStore` makes it. Each one holds this part's lock, waits until everything logged is
applied, reads the current row from DuckDB, decides, logs its rows through the write path and waits
until they are applied too: the next write then reads the truth from DuckDB, and nothing needs a copy
of the rows in memory that a set-aside log entry could leave wrong. That costs a DuckDB commit a write
(a few milliseconds), and conversations write once a turn.

A head's messages go into the content-addressed message store (`WritePath.log_rows`): messages a run
recorded already cost their 32-byte reference. `conversations` holds the summary, `conversation_heads`
the reference list and the searchable text; each keeps only a conversation's latest row (batch.py,
`LATEST_ONLY`), and naming or archiving writes only the small summary row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

import duckdb
from steprec.proto import wire

from .applier import Applier
from .batch import column_names
from .connection import dicts
from .write_path import WritePath

SUMMARY_COLUMNS = tuple(name for name in column_names("conversations") if name not in ("write_seq", "metadata_folded"))
"""A summary as the recorder answers it: the `conversations` columns, times in unix nanoseconds."""

_SELECT_SUMMARY = ", ".join(
    f"epoch_ns({name}) AS {name}" if name in ("updated_at", "archived_at") else f"c.{name}" for name in SUMMARY_COLUMNS
)
_WRITTEN = ("revision", "naming_version", "naming_tokens", "archived_at")
"""What each write changes: a stored row that differs in none of them after the wait is this write's."""
_NAMING = ("title", "subtitle", "tags", "title_source", "naming_version", "named_revision", "naming_tokens")


def _now_us() -> int:
    """Now in unix nanoseconds, at the microsecond precision DuckDB keeps: what a save answers is what a read does."""
    return time.time_ns() // 1000 * 1000


class Conflict(Exception):
    """Another writer changed or deleted the conversation; the caller must reload before writing."""


class NotStored(Exception):
    """A write the database refused for good (its log entry was set aside, applier.py); nothing changed."""


def folded_metadata(summary: dict) -> str:
    """What a search matches besides the messages' text: the summary's words, Unicode case-folded."""
    words = [summary["conversation_id"], summary["workspace"], summary["title"], summary["subtitle"], *summary["tags"]]
    words += [summary[name] for name in ("model", "run_id", "checkout_repository", "checkout_name",
                                         "checkout_root", "checkout_branch") if summary[name]]  # fmt: skip
    return "\n".join(words).casefold()


def read_summary(cursor: duckdb.DuckDBPyConnection, conversation_id: str) -> dict | None:
    rows = dicts(cursor.execute(f"SELECT {_SELECT_SUMMARY} FROM conversations c WHERE conversation_id = ?",
                                [conversation_id]))  # fmt: skip
    return rows[0] if rows else None


def read_head(cursor: duckdb.DuckDBPyConnection, conversation_id: str) -> tuple[dict, bytes] | None:
    """A conversation's summary and its messages' digests (concatenated, in history order), or None."""
    summary = read_summary(cursor, conversation_id)
    if summary is None:
        return None
    (refs,) = cursor.execute("SELECT refs FROM conversation_heads WHERE conversation_id = ?",
                             [conversation_id]).fetchone()  # fmt: skip
    return summary, bytes(refs)


def list_summaries(
    cursor: duckdb.DuckDBPyConnection, *, query: str, limit: int, offset: int, archived: bool | None
) -> list[dict]:
    """Summaries, most recently active first, without messages; `query` matched case-folded against the heads'
    user and assistant text and the summaries' words. Only a query reads the heads' text."""
    filters, params = [], []
    if query:
        filters.append("(contains(h.text_folded, ?) OR contains(c.metadata_folded, ?))")
        params += [query.casefold()] * 2
    if archived is not None:
        filters.append("archived_at IS NOT NULL" if archived else "archived_at IS NULL")
    join = " JOIN conversation_heads h USING (conversation_id)" if query else ""
    where = f" WHERE {' AND '.join(filters)}" if filters else ""
    return dicts(cursor.execute(
        f"SELECT {_SELECT_SUMMARY} FROM conversations c{join}{where}"
        " ORDER BY c.updated_at DESC, c.conversation_id LIMIT ? OFFSET ?", [*params, limit, offset],
    ))  # fmt: skip


def remove_head(cursor: duckdb.DuckDBPyConnection, conversation_id: str, revision: int) -> None:
    """Delete the head if its revision is still `revision` (inside the caller's transaction); Conflict if not."""
    current = cursor.execute("SELECT revision FROM conversations WHERE conversation_id = ?",
                             [conversation_id]).fetchone()  # fmt: skip
    if current is None or current[0] != revision:
        raise Conflict("the conversation changed or was deleted; refresh before deleting it")
    for table in ("conversations", "conversation_heads"):
        cursor.execute(f"DELETE FROM {table} WHERE conversation_id = ?", [conversation_id])


class ConversationWrites:
    """Save, name and archive conversation heads, each a compare-and-swap (see the module's docstring)."""

    def __init__(
        self,
        connection: duckdb.DuckDBPyConnection,
        applier: Applier,
        write: WritePath,
        last_sequence: Callable[[], int],
        lease: Callable[[str], AbstractContextManager[None]] | None = None,
    ) -> None:
        self._connection = connection
        self._applier = applier
        self._write = write
        self._last_sequence = last_sequence
        self.lock = threading.Lock()
        """Held by every conversation write and by a conversation's deletion: they decide on what they read."""
        self._lease = lease
        """In a lake, what makes a write exclusive among its recorders too (`lake.leases`)."""

    @contextmanager
    def exclusive(self, conversation_id: str) -> Iterator[None]:
        """Hold `lock`, and in a lake the conversation's lease: no other write of it decides meanwhile."""
        with self.lock, self._lease(conversation_id) if self._lease else nullcontext():
            yield

    def save(self, summary: dict, refs: bytes, bodies: Sequence[str], text: str) -> dict:
        """Commit a head if `summary["revision"]` is still the stored revision (0: a new conversation); return the
        committed summary. A naming that landed since the caller read keeps its fields; new content is activity,
        so it lists an archived conversation again. Raises Conflict for a stale writer or a deleted conversation."""
        with self.exclusive(summary["conversation_id"]):
            prior = self._current(summary["conversation_id"])
            expected = summary["revision"]
            if prior is None and expected != 0:
                raise Conflict("the conversation was deleted; start a new one before saving")
            if prior is not None and prior["revision"] != expected:
                raise Conflict("the conversation changed in another process; load it again before continuing")
            saved = {**summary, "revision": expected + 1, "updated_at": _now_us(),
                     "message_count": len(refs) // wire.DIGEST_SIZE}  # fmt: skip
            if prior is not None:
                saved.update({name: prior[name] for name in _NAMING}, archived_at=None)
            head = {"conversation_id": saved["conversation_id"], "revision": saved["revision"], "refs": refs,
                    "text_folded": text.casefold()}  # fmt: skip
            self._commit(saved, head=head, refs=refs, bodies=bodies)
            return saved

    def name(self, source: dict, *, title: str, subtitle: str, tags: list[str], manual: bool, tokens: int) -> bool:
        """Apply a name only to the revision and naming version it was made from, and never over a title the user
        set unless this one is the user's too; the tokens it used count either way. The activity time stays."""
        with self.exclusive(source["conversation_id"]):
            current = self._current(source["conversation_id"])
            if current is None:
                return False  # never bring a deleted conversation back
            if tokens:
                current["naming_tokens"] += tokens
            stale = (current["revision"], current["naming_version"]) != (source["revision"], source["naming_version"])
            if stale or (current["title_source"] == "user" and not manual):
                if tokens:
                    self._commit(current)
                return False
            current.update(
                title=title, subtitle=subtitle, tags=list(tags), title_source="user" if manual else "generated",
                naming_version=current["naming_version"] + 1, named_revision=current["revision"],
            )  # fmt: skip
            self._commit(current)
            return True

    def set_archived(self, conversation_id: str, archived: bool) -> dict:
        """Archive (keeping the first time) or unarchive; the messages, revision and activity time stay.
        Raises LookupError for an unknown conversation."""
        with self.exclusive(conversation_id):
            current = self._current(conversation_id)
            if current is None:
                raise LookupError(f"no saved conversation {conversation_id!r}")
            if archived != (current["archived_at"] is not None):
                current["archived_at"] = _now_us() if archived else None
                self._commit(current)
            return current

    def _current(self, conversation_id: str) -> dict | None:
        self._applier.wait_applied(self._last_sequence(), for_write=True)
        with self._connection.cursor() as cursor:
            return read_summary(cursor, conversation_id)

    def _commit(
        self, summary: dict, *, head: dict | None = None, refs: bytes = b"", bodies: Sequence[str] = ()
    ) -> None:
        rows = {"conversations": {**summary, "metadata_folded": folded_metadata(summary)}}
        if head is not None:
            rows["conversation_heads"] = head
        sequence = self._write.log_rows(wire.split_digests(refs), bodies, rows)
        self._applier.wait_applied(sequence, for_write=True)
        with self._connection.cursor() as cursor:  # applied, or set aside as one DuckDB can never take
            stored = read_summary(cursor, summary["conversation_id"])
        if stored is None or any(stored[name] != summary[name] for name in _WRITTEN):
            raise NotStored(f"the recorder could not store this write (log entry {sequence} was set aside)")
