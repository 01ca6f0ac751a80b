"""Query parameters and path parts checked before any read: a bad one is a 400 that says what was wrong.

The browser's URLs are input from anyone who can send a link, so each value is parsed with the same rules the
query service applies (run ids, outcomes, page tokens), and an unknown parameter is refused rather than ignored:
a typo in a filter must not silently show everything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime

from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from steprec.proto import wire

OUTCOMES = ("running", "completed", "failed")
MAX_TEXT = 200
_PAGE_TOKEN = re.compile(r"(-?\d{1,20}):(\d{1,20})")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class BadRequest(HTTPException):
    def __init__(self, detail: str) -> None:
        super().__init__(400, detail)


class NotFound(HTTPException):
    def __init__(self, detail: str) -> None:
        super().__init__(404, detail)


def run_id(value: str, *, what: str = "run id") -> str:
    if not wire.is_run_id(value):
        raise BadRequest(f"{what} {value[:80]!r} is not {wire.RUN_ID_RULE}")
    return value


def sha256(value: str) -> str:
    if not _SHA256.fullmatch(value):
        raise BadRequest(f"{value[:80]!r} is not a SHA-256 digest (64 lowercase hex digits)")
    return value


class Params:
    """One request's query parameters, each read at most once, typed, with the reason when it is bad."""

    def __init__(self, query: QueryParams, allowed: Iterable[str]) -> None:
        allowed = set(allowed)
        if unknown := sorted(set(query) - allowed):
            known = ", ".join(sorted(allowed)) or "none"
            raise BadRequest(f"unknown query parameter(s) {', '.join(unknown)}; this page takes: {known}")
        for name in query:
            if len(query.getlist(name)) > 1:
                raise BadRequest(f"the query parameter {name} is given more than once")
        self._query = query

    def text(self, name: str) -> str | None:
        value = self._query.get(name) or None
        if value is not None and (len(value) > MAX_TEXT or not value.isprintable()):
            raise BadRequest(f"{name} must be printable text of at most {MAX_TEXT} characters")
        return value

    def run_id(self, name: str) -> str | None:
        value = self._query.get(name) or None
        return None if value is None else run_id(value, what=name)

    def choice(self, name: str, choices: tuple[str, ...]) -> str | None:
        value = self._query.get(name) or None
        if value is not None and value not in choices:
            raise BadRequest(f"{name} must be one of {', '.join(choices)}, not {value[:40]!r}")
        return value

    def integer(self, name: str, *, default: int, low: int, high: int) -> int:
        value = self._query.get(name) or None
        if value is None:
            return default
        if not re.fullmatch(r"-?\d{1,10}", value) or not low <= int(value) <= high:
            raise BadRequest(f"{name} must be a whole number from {low} to {high}, not {value[:40]!r}")
        return int(value)

    def optional_integer(self, name: str, *, low: int, high: int) -> int | None:
        return None if not self._query.get(name) else self.integer(name, default=0, low=low, high=high)

    def instant_ns(self, name: str) -> int | None:
        """An ISO 8601 date or time (naive means UTC), as Unix nanoseconds."""
        value = self._query.get(name) or None
        if value is None:
            return None
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            example = "2026-12-06T10:00"
            raise BadRequest(f"{name} must be an ISO 8601 date or time such as {example}, not {value[:40]!r}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000

    def page_token(self, name: str) -> tuple[int, int] | None:
        value = self._query.get(name) or None
        if value is None:
            return None
        if not (match := _PAGE_TOKEN.fullmatch(value)):
            raise BadRequest(f"{name} is not a page token this recorder issued")
        return int(match[1]), int(match[2])


def page_token(row: dict) -> str:
    """The token naming a newest-first page's last run, which the next page starts after."""
    return f"{row['started_at_ns']}:{row['write_seq']}"
