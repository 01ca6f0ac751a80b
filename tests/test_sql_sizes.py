"""The size check (recorder/sql_sizes.py) in-process: what it refuses and why, what it lets through, and its table of
growing functions checked against the pinned DuckDB's whole catalog. tests/test_hostile_queries.py sends the same
attacks to a real recorder and measures time and memory."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest
from steprec.recorder.querier import sql_sizes
from steprec.recorder.querier.sql import SqlRefused, check_query

from .test_hostile_queries import AMPLIFIERS

DOCS = Path(__file__).resolve().parent.parent / "docs" / "sql.md"
ALLOWED = [
    "SELECT rpad(run_id, 10, ' '), lpad('x', 5, '0'), repeat('-', 40) FROM runs",
    "SELECT printf('%5.2f', 1.0), format('{:>5}', 'a'), format('{{literal}}')",
    "SELECT list_transform([1, 2], x -> x + 1), [x * 2 FOR x IN [1, 2]], list_reduce([1, 2], (a, x) -> a + x)",
    "SELECT range(10), generate_series(-5, 5), list_resize([1], 100)",
    "SELECT count(*) FROM range(1000000000000)",
    "SELECT * FROM generate_series(1, 10), repeat('a', 1000000000)",
    "SELECT regexp_replace(message, 'a', 'b', 'g'), replace(message, '\"', '') FROM messages",
    "SELECT list(message), string_agg(run_id, ',') FROM messages, runs",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 10) SELECT * FROM r",
    "SELECT * FROM runs, LATERAL (SELECT run_id || 'x' AS y) WHERE run_id IN (SELECT run_id FROM events)",
    "SELECT count(*) OVER (PARTITION BY run_id ORDER BY seq), #1, 'abc'[1:2], {'a': 1}.a FROM events",
    "DESCRIBE runs",
    "SUMMARIZE SELECT 1",
    "UNPIVOT runs ON run_id INTO NAME k VALUE v",
    "SELECT COLUMNS(c -> c LIKE 'run%') FROM runs",
    *re.findall(r"```sql\n(-- example.*?)```", DOCS.read_text(), re.S),
]


@pytest.mark.parametrize("query", ALLOWED)
def test_ordinary_queries_pass(query: str) -> None:
    check_query(query)


@pytest.mark.parametrize(("query", "reason"), AMPLIFIERS)
def test_queries_that_build_huge_values_are_refused_with_the_reason(query: str, reason: str) -> None:
    with pytest.raises(SqlRefused, match=reason):
        check_query(query)


def test_a_statement_the_check_cannot_read_is_refused() -> None:
    """check_query lets only a single SELECT reach the size check; anything DuckDB will not serialise is refused."""
    with pytest.raises(sql_sizes.SizeRefused, match="cannot be checked"):
        sql_sizes.SizeCheck().check("PIVOT events ON kind")


def _size(value: object) -> int:
    """What a value holds, in the check's terms: a string's bytes, a list's elements each with its 16-byte slot."""
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, list | tuple):
        return sum(_size(item) + sql_sizes.FIXED_BYTES for item in value)
    if isinstance(value, dict):
        return sum(_size(k) + _size(v) for k, v in value.items())
    return sql_sizes.FIXED_BYTES


def test_every_function_of_one_string_stays_within_its_bound() -> None:
    """The check counts a function as additive unless FACTORS says otherwise: every scalar function of one string
    in the pinned DuckDB is run on a sample full of characters that encoders expand (as text, and as a blob, which
    a function taking text reads escaped), and none may exceed the bound the check gives it. A DuckDB upgrade
    that adds a growing function fails here until it is in FACTORS."""
    connection = duckdb.connect()
    names = connection.execute(
        "SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_type = 'scalar'"
        " AND len(parameter_types) = 1 AND parameter_types[1] IN ('VARCHAR', 'BLOB', 'ANY', 'JSON')"
        " AND NOT has_side_effects AND regexp_matches(function_name, '^[a-z_0-9]+$') ORDER BY 1"
    ).fetchall()
    aliases = sql_sizes.SizeCheck().aliases
    sample = ('{"a": [1, 2], "b": "x y"} \u00e9\u4e2d\U0001f600\\n<>&%\'\t' * 16).encode()
    checked, over = 0, {}
    for (name,) in names:
        for argument in (sample.decode(), sample):
            try:
                value = connection.execute(f"SELECT {name}(?)", [argument]).fetchone()[0]
            except duckdb.Error:
                continue
            checked += 1
            canonical = aliases.get(name, name)
            escaped = sql_sizes.BLOB_AS_TEXT if isinstance(argument, bytes) else 1  # a blob read as text: \\xNN
            bound = escaped * sql_sizes.factor(canonical) * len(sample) + sql_sizes.FIXED_BYTES
            if _size(value) > bound:
                over[name] = _size(value) / len(sample)
    assert checked > 100
    assert not over, f"functions that grow their input past the check's bound (size / input): {over}"
