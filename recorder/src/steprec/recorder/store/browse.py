"""The reads the run browser needs beyond the query service's: newest first, by page, and the shape of a page.

A page shows the newest runs, a level of a tree with whether each run has more below it, the runs that need
recovery, the conversations, and messages as stored (media left as markers, so a page links a blob instead of
inlining megabytes of base64). Each read is bounded by a page size, so a page costs the same on a store of any
size; the runs' outcome and end come from `Reads._runs`, like every other run read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .media import MARKER
from .reads import Reads, run_filters

NEWEST_FIRST = "ORDER BY started_at_ns DESC, write_seq DESC"
_ENDED_KINDS = {"completed": "run_completed", "failed": "run_failed"}


class BrowseReads(Reads):
    """Reads in the order and sizes a person browsing runs asks for them."""

    def newest_runs(
        self,
        *,
        limit: int,
        before: tuple[int, int] | None = None,
        agent_name: str | None = None,
        conversation_id: str | None = None,
        outcome: str | None = None,
        started_at_or_after_ns: int | None = None,
        started_before_ns: int | None = None,
    ) -> list[dict]:
        """Runs newest first, `limit` of them, older than `before` (a previous page's last `(started_at_ns,
        write_seq)`). The filter and the limit are applied to `runs` alone, before outcomes are joined."""
        equal = {"agent_name": agent_name, "conversation_id": conversation_id}
        filters, params = run_filters(equal, started_at_or_after_ns, started_before_ns, before=before)
        if outcome == "running":
            filters.append("r.end_kind IS NULL")
        elif outcome is not None:
            filters.append("r.end_kind = ?")
            params.append(_ENDED_KINDS[outcome])
        chosen = (
            f"SELECT r.*, 0 AS depth FROM runs r WHERE {' AND '.join(filters) or 'true'}"
            f" ORDER BY r.started_at DESC, r.write_seq DESC LIMIT {int(limit)}"
        )
        return self._runs("", chosen, params, NEWEST_FIRST, [])

    def recovery_runs(self, *, limit: int, before: tuple[int, int] | None = None) -> list[dict]:
        """Failed runs and runs with a tool call that may or may not have happened, newest first, each with
        `unresolved` (how many such calls)."""
        filters, params = run_filters({}, before=before)
        needing = (
            "(r.end_kind = 'run_failed'"
            " OR r.run_id IN (SELECT run_id FROM recorded.tool_effects WHERE status = 'started'))"
        )
        chosen = (
            f"SELECT r.*, 0 AS depth FROM runs r WHERE {' AND '.join([needing, *filters])}"
            f" ORDER BY r.started_at DESC, r.write_seq DESC LIMIT {int(limit)}"
        )
        runs = self._runs("", chosen, params, NEWEST_FIRST, [])
        counts = self._counted(
            "SELECT run_id, count(*) FROM recorded.tool_effects WHERE status = 'started' AND run_id IN ({0})"
            " GROUP BY 1",
            [run["run_id"] for run in runs],
        )
        return [{**run, "unresolved": counts.get(run["run_id"], 0)} for run in runs]

    def below_counts(self, run_ids: Sequence[str]) -> dict[str, int]:
        """How many delegates and forks each run has directly below it (runs with none are left out)."""
        return self._counted(
            "SELECT origin, count(*) FROM (SELECT parent_run_id AS origin FROM runs WHERE parent_run_id IN ({0})"
            " UNION ALL SELECT forked_from_run_id FROM runs WHERE forked_from_run_id IN ({0})) GROUP BY 1",
            run_ids,
        )

    def runs_below(self, run_id: str, *, limit: int, offset: int) -> list[dict]:
        """A run's delegates and forks (one level), in start order, a page of them."""
        chosen = (
            "SELECT r.*, 0 AS depth FROM runs r WHERE r.parent_run_id = ? OR r.forked_from_run_id = ?"
            f" ORDER BY r.started_at, r.write_seq LIMIT {int(limit)} OFFSET {int(offset)}"
        )
        return self._runs("", chosen, [run_id, run_id], "ORDER BY started_at_ns, write_seq", [])

    def conversation_ids(self, *, limit: int, offset: int) -> list[dict]:
        """Conversations the runs name, the most recently active first, with their run count and time span."""
        with self.cursor() as cursor:
            rows = cursor.execute(
                "SELECT conversation_id, count(*) AS runs, epoch_ns(min(started_at)) AS first_ns,"
                " epoch_ns(max(started_at)) AS last_ns FROM runs WHERE conversation_id IS NOT NULL"
                " GROUP BY conversation_id ORDER BY last_ns DESC, conversation_id LIMIT ? OFFSET ?",
                [limit, offset],
            ).fetchall()
        return [dict(zip(("conversation_id", "runs", "first_ns", "last_ns"), row, strict=True)) for row in rows]

    def stored_messages(self, digests: Sequence[bytes]) -> list[str]:
        """Messages by digest as stored: media left as markers naming their blob. Raises `LookupError` like
        `read_messages`."""
        with self.cursor() as cursor:
            return self._messages(cursor, digests, restore=False)

    def media_type(self, uri: str) -> str | None:
        """The media type a stored message gives the blob `uri` (its BinaryContent's `media_type`; text for a
        large text part), or None when no stored message refers to it."""
        with self.cursor() as cursor:
            row = cursor.execute("SELECT digest FROM media_refs WHERE uri = ? LIMIT 1", [uri]).fetchone()
            if row is None:
                return None
            (body,) = self._messages(cursor, [bytes(row[0])], restore=False)
        return _declared_type(json.loads(body), uri) or "application/octet-stream"

    def _counted(self, template: str, run_ids: Sequence[str]) -> dict[str, int]:
        if not run_ids:
            return {}
        marks = ", ".join("?" * len(run_ids))
        with self.cursor() as cursor:
            return dict(cursor.execute(template.format(marks), list(run_ids) * template.count("{0}")).fetchall())


def _declared_type(node: object, uri: str) -> str | None:
    """The media type beside the marker naming `uri`, anywhere in a message's JSON."""
    if isinstance(node, list):
        return next((found for item in node if (found := _declared_type(item, uri))), None)
    if not isinstance(node, dict):
        return None
    marker = node.get(MARKER)
    if isinstance(marker, dict) and marker.get("uri") == uri:
        if marker.get("field") == "content":
            return "text/plain; charset=utf-8"
        media_type = node.get("media_type")
        return media_type if isinstance(media_type, str) else None
    return next((found for value in node.values() if (found := _declared_type(value, uri))), None)
