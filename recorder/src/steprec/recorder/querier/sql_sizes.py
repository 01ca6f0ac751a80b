"""The size check a query passes before it runs: no value it computes may grow past a bound.

DuckDB checks for an interrupt between vectors, and counts against its memory limit only what its
buffer manager holds. One function call that builds a huge value does neither: `repeat('a',
3000000000)` grew the recorder by 4 GB and ignored a 1 s time limit for 10 s, `len(range(300000000))`
by 5 GB (and would have gone on). No DuckDB setting caps a string or list, and the query cannot run
elsewhere (another process cannot open the database the recorder writes). So the query's parse tree
(`json_serialize_sql`, which parses and never runs anything) is walked before it runs, and every
value gets an upper bound on its size in bytes:

- a constant is its own size; a column, a parameter or a collecting aggregate (`list`, `string_agg`)
  is COLUMN_BYTES, a nominal stored value (an aggregate grows in DuckDB's counted memory, verified);
  a column of a subquery or CTE is the bound of what that query selects;
- most functions are additive: their result is at most the sum of their arguments (`||`, `concat`,
  `list_concat`, `substr`, ...), so nesting them grows a bound leaf by leaf, never by doubling;
  encoders are their factor times that (`bin` 8, `hex` 2, ...); replacements multiply the string by
  the replacement;
- a function whose result size is an argument (`repeat`, `lpad`, `list_resize`, scalar `range`, a
  `printf` width) takes that argument only as a constant;
- a lambda may use only its own parameters, and a `list_reduce` step may not copy its accumulator
  more than once (else each element doubles it).

A query with any value bound over VALUE_LIMIT_BYTES (64 stored values, or that many bytes of
constant-built text), or with anything the walk does not know, is refused with the reason. The
bound is per row: DuckDB works 2,048 rows at a time, so one vector stays under 512 MiB. Function
names are resolved through DuckDB's own alias table, so `array_resize` is `list_resize`.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import duckdb

COLUMN_BYTES = 4096
"""The nominal size of one value read from a table, a parameter or a collecting aggregate."""
VALUE_LIMIT_BYTES = 256 * 1024
"""The most any one computed value may be: 64 stored values, or 256 KiB made from constants."""
FIXED_BYTES = 16
"""A number, a date, a boolean: what one fixed-size value costs."""

SIZED_BY_ARGUMENT = {"repeat", "lpad", "rpad", "list_resize", "range", "generate_series", "printf", "format"}
"""Scalar functions whose result size an argument sets."""
FACTORS = {"bin": 8, "to_binary": 8, "hex": 2, "to_hex": 2, "to_base64": 2, "url_encode": 3, "to_json": 6,
           "json_quote": 6, "array_to_json": 6, "row_to_json": 6, "json_array": 6, "json_object": 6,
           "json_serialize_sql": 64, "string_split": 17, "str_split": 17, "string_to_array": 17,
           "regexp_split_to_array": 17, "string_split_regex": 17, "str_split_regex": 17, "split": 17, "parse_path": 17,
           "regexp_escape": 2, "alias": 2}  # fmt: skip
"""Functions whose result may be a few times their input: an encoding, or a list of pieces (16 bytes each)."""
COLLATION_FACTOR = 4
"""`icu_collate_*` (one per locale): a sort key, about three bytes per character."""
BLOB_AS_TEXT = 4
"""A blob cast to text, explicitly or by a function that takes text, is escaped: `\\xNN` for a byte."""
MULTIPLYING = {"replace": 2, "regexp_replace": 2}
"""Functions that put their argument at this position in place of each match: the string times it."""
COLLECTING = {"list", "array_agg", "string_agg", "group_concat", "listagg", "histogram", "map_agg", "json_group_array",
              "json_group_object", "json_group_structure"}  # fmt: skip
"""Aggregates whose result holds every row's value: built in DuckDB's counted memory, then one value."""
REDUCING = {"list_reduce"}
FIXED_RESULT = {"+", "-", "*", "/", "//", "%", "**", "^", "=", "!=", "<>", "<", ">", "<=", ">=", "~~", "!~~", "~~*",
                "!~~*", "count", "count_star", "sum", "avg", "len", "length", "strlen", "octet_length",
                "array_length", "epoch_us", "epoch_ms", "epoch_ns", "epoch", "round"}  # fmt: skip
"""Functions and operators whose result is one fixed-size value, whatever their arguments."""
RUNS_SQL = {"query", "json_execute_serialized_sql"}
"""Table functions that run SQL given as a value, which this check never sees: refused."""
OUTSIDE_PREFIXES = ("postgres_", "ducklake_")
"""Functions of the lake's extensions: they reach the catalog database itself (postgres_query runs its SQL
there, outside any read-only transaction) or change the lake (ducklake_expire_snapshots): refused."""
CATALOG_DATABASE = "__ducklake_metadata"
"""What DuckLake names the catalog database it attaches: its tables are the lake's bookkeeping, not records."""
FIXED_CLASSES = {"COMPARISON", "CONJUNCTION", "BETWEEN", "POSITIONAL_REFERENCE"}
SUM_CLASSES = {"OPERATOR", "CASE", "COLLATE", "WINDOW", "STAR", "CAST"}
QUERY_NODES = {"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"}
TABLE_REFS = {"BASE_TABLE", "JOIN", "SUBQUERY", "TABLE_FUNCTION", "EXPRESSION_LIST", "EMPTY", "SHOW_REF", "PIVOT"}
_WIDTHS = re.compile(r"\d+")
_DYNAMIC_WIDTH = re.compile(r"%[^a-zA-Z%]*\*|\{[^{}]*:[^{}]*\{")
"""printf's `%*d`/`%.*f` and format's `{:>{}}`: a width set by an argument, not the format string."""


class SizeRefused(ValueError):
    """A query that could build a value too large to stop, or one the check does not understand."""


@dataclass
class _Scope:
    column: int = COLUMN_BYTES
    """What a column reference here may hold."""
    ctes: dict[str, int] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)
    """Lambda parameters in scope; inside a lambda, only these may be referenced."""
    in_lambda: bool = False


class SizeCheck:
    """Parses with a private in-memory DuckDB and bounds every value of a query; `check` raises SizeRefused."""

    def __init__(self) -> None:
        self._connection = duckdb.connect(":memory:")
        self._connection.execute("SET enable_external_access = false")
        self._lock = threading.Lock()
        self.aliases = dict(
            self._connection.execute(
                "SELECT DISTINCT function_name, alias_of FROM duckdb_functions() WHERE alias_of IS NOT NULL"
            ).fetchall()
        )

    def check(self, query: str) -> None:
        with self._lock, self._connection.cursor() as cursor:
            tree = cursor.execute("SELECT json_serialize_sql(?)", [query]).fetchone()[0]
        try:
            parsed = json.loads(tree)
            if parsed.get("error"):
                reason = parsed.get("error_message", "unknown error")
                raise SizeRefused(f"the query cannot be checked for the size of what it builds: {reason}")
            for statement in parsed["statements"]:
                self._query(statement["node"], _Scope())
        except RecursionError:
            raise SizeRefused("the query nests too deeply to be checked") from None
        except (KeyError, TypeError, AttributeError, IndexError) as error:  # a tree shape this walk does not know
            raise SizeRefused(f"the query has a part the size check does not know ({error!r:.100})") from None

    # -- queries and tables --------------------------------------------------------------------------------------

    def _query(self, node: dict, scope: _Scope) -> int:
        """The bound of any value the query node selects."""
        kind = node.get("type")
        if kind not in QUERY_NODES:
            raise SizeRefused(f"the query has a part the size check does not know ({kind})")
        scope = _Scope(scope.column, dict(scope.ctes))
        for cte in node.get("cte_map", {}).get("map", []):
            scope.ctes[cte["key"].lower()] = COLUMN_BYTES  # a recursive reference sees its anchor's bound below
            scope.ctes[cte["key"].lower()] = self._query(cte["value"]["query"]["node"], scope)
        for modifier in node.get("modifiers", []):
            self._walk_expressions(modifier, scope)
        if kind == "SELECT_NODE":
            scope.column = max(scope.column, self._table(node["from_table"], scope))
            for key in ("where_clause", "group_expressions", "having", "qualify", "sample"):
                self._walk_expressions(node.get(key), scope)
            return max((self._bound(e, scope) for e in node["select_list"]), default=0)
        if kind == "RECURSIVE_CTE_NODE":
            anchor = self._query(node["left"], scope)
            scope.ctes[node["cte_name"].lower()] = anchor
            return max(anchor, self._query(node["right"], scope))
        if kind == "SET_OPERATION_NODE":
            return max(self._query(node["left"], scope), self._query(node["right"], scope))
        return self._query(node["child"], scope)  # CTE_NODE

    def _table(self, ref: dict, scope: _Scope) -> int:
        """The bound of any column the table reference gives."""
        kind = ref.get("type")
        if kind not in TABLE_REFS:
            raise SizeRefused(f"the query reads from something the size check does not know ({kind})")
        if kind == "BASE_TABLE":
            if ref.get("catalog_name", "").lower().startswith(CATALOG_DATABASE):
                raise SizeRefused("the lake's catalog database is not for queries; read the recorded views")
            return scope.ctes.get(ref["table_name"].lower(), COLUMN_BYTES) if not ref["schema_name"] else COLUMN_BYTES
        if kind == "JOIN":
            joined = max(self._table(ref["left"], scope), self._table(ref["right"], scope))
            self._walk_expressions(ref.get("condition"), _Scope(max(scope.column, joined), scope.ctes))
            return joined
        if kind == "SUBQUERY":
            return self._query(ref["subquery"]["node"], scope)
        if kind == "TABLE_FUNCTION":  # range(), generate_series(), repeat() here stream rows: the limits cut them
            function = ref["function"]
            name = function["function_name"].lower()
            if self.aliases.get(name, name) in RUNS_SQL:
                raise SizeRefused(f"{name}() runs SQL text the size check cannot read; it is refused")
            _refuse_outside(name)
            for child in function.get("children", []):
                self._bound(child, scope)
            return COLUMN_BYTES
        if kind == "EXPRESSION_LIST":
            return max((self._bound(e, scope) for row in ref["values"] for e in row), default=0)
        if kind == "PIVOT":  # moves values between rows and columns; its aggregates are bounded like any other
            source = self._table(ref["source"], scope)
            self._walk_expressions({k: v for k, v in ref.items() if k != "source"}, _Scope(source, scope.ctes))
            return source
        if kind == "SHOW_REF":
            return self._query(ref["query"], scope) if ref.get("query") else COLUMN_BYTES
        return 0  # EMPTY

    # -- expressions ------------------------------------------------------------------------------------------

    def _walk_expressions(self, value: object, scope: _Scope) -> None:
        """Bound (and so check) every expression and query under `value`, a clause of any shape."""
        for expression in _expressions(value):
            self._bound(expression, scope)

    def _bound(self, node: dict, scope: _Scope) -> int:
        if "class" not in node:
            return self._query(node, scope)
        kind = node["class"]
        if kind == "CONSTANT":
            value = node["value"].get("value")
            return len(value.encode()) if isinstance(value, str) else FIXED_BYTES
        if kind == "COLUMN_REF":
            name = node["column_names"][-1].lower()
            if name in scope.params and len(node["column_names"]) == 1:
                return scope.params[name]
            if scope.in_lambda:
                raise SizeRefused(f"a lambda may use only its own parameters, not {'.'.join(node['column_names'])}")
            return scope.column
        if kind == "PARAMETER":
            return COLUMN_BYTES
        if kind == "SUBQUERY":
            if scope.in_lambda:
                raise SizeRefused("a lambda may use only its own parameters, not a subquery")
            inner = self._query(node["subquery"]["node"], scope)
            self._walk_expressions(node.get("child"), scope)
            return inner
        if kind == "FUNCTION":
            return self._limited(self._function(node, scope), node)
        if kind == "LAMBDA":
            return self._lambda(node, scope, scope.column)[0]
        if kind in FIXED_CLASSES | SUM_CLASSES:
            total = sum(self._bound(e, scope) for e in _expressions(list(node.values())))
            if kind in FIXED_CLASSES:
                return FIXED_BYTES
            return self._limited(BLOB_AS_TEXT * total + FIXED_BYTES if kind == "CAST" else total, node)
        raise SizeRefused(f"the query has an expression the size check does not know ({kind})")

    def _function(self, node: dict, scope: _Scope) -> int:
        name = node["function_name"].lower()
        name = self.aliases.get(name, name)
        _refuse_outside(name)
        children = node.get("children", [])
        extras = {k: node.get(k) for k in ("filter", "order_bys")}
        self._walk_expressions(extras, scope)
        lambdas = [i for i, child in enumerate(children) if child.get("class") == "LAMBDA"]
        if lambdas:
            return self._lambda_function(name, children, lambdas[0], scope)
        sizes = [self._bound(child, scope) for child in children]
        if name in SIZED_BY_ARGUMENT:
            return _sized(name, children, sizes)
        if name in COLLECTING:
            return COLUMN_BYTES
        if name in FIXED_RESULT:
            return FIXED_BYTES
        if name in MULTIPLYING and len(sizes) > MULTIPLYING[name]:
            return sizes[0] * (sizes[MULTIPLYING[name]] + 1) + sum(sizes[1:])
        return factor(name) * sum(sizes) + FIXED_BYTES

    def _lambda_function(self, name: str, children: list[dict], at: int, scope: _Scope) -> int:
        """A list function with a lambda: the list's bound, times what the lambda makes of each element."""
        others = [self._bound(child, scope) for i, child in enumerate(children) if i != at]
        listed = sum(others)
        made, grown = self._lambda(children[at], scope, listed)
        if name in REDUCING:
            if grown > listed:
                raise SizeRefused(f"{name}() whose step copies its accumulator more than once is refused")
            return made + listed
        return listed + made * max(1, listed // FIXED_BYTES)

    def _lambda(self, node: dict, scope: _Scope, element: int) -> tuple[int, int]:
        """What the lambda's body makes from parameters of `element` bytes, and how much more when the first doubles."""
        params = [p.lower() for p in _lambda_params(node["lhs"])]

        def body(first: int) -> int:
            values = {p: (first if i == 0 else element) for i, p in enumerate(params)}
            return self._bound(node["expr"], _Scope(scope.column, scope.ctes, values, in_lambda=True))

        once = body(element)
        return once, body(2 * element) - once

    @staticmethod
    def _limited(bound: int, node: dict) -> int:
        if bound > VALUE_LIMIT_BYTES:
            what = node["class"].lower()
            if node["class"] == "FUNCTION":
                name = node["function_name"]
                what = f"{name}()" if name[:1].isalpha() or name[:1] == "_" else f"the {name} operator"
            raise SizeRefused(
                f"{what} could build a value of {bound:,} bytes per row, counting each column value as"
                f" {COLUMN_BYTES:,}; the limit is {VALUE_LIMIT_BYTES:,}"
            )
        return bound


def _refuse_outside(name: str) -> None:
    if name.startswith(OUTSIDE_PREFIXES):
        raise SizeRefused(f"{name}() reaches outside the recorded data; it is not allowed")


def factor(name: str) -> int:
    """How many times its arguments' size a function's result may be (its canonical name)."""
    return FACTORS.get(name, COLLATION_FACTOR if name.startswith("icu_collate_") else 1)


def _sized(name: str, children: list[dict], sizes: list[int]) -> int:
    """The result bound of a function whose size an argument sets; refused unless that argument is a small constant."""
    if name in ("printf", "format"):
        pattern = _constant(children[0]) if children else None
        if not isinstance(pattern, str):
            raise SizeRefused(f"{name}() with a format that is not a constant string is refused")
        if _DYNAMIC_WIDTH.search(pattern):
            raise SizeRefused(f"{name}() with a width or precision taken from an argument (* or {{}}) is refused")
        return sum(sizes) + sum(int(width) for width in _WIDTHS.findall(pattern[:1000])) + FIXED_BYTES
    if name in ("range", "generate_series"):
        numbers = [_constant(child) for child in children]
        if not numbers or not all(isinstance(n, int) for n in numbers):
            raise SizeRefused(f"{name}() as a list takes only integer constants (in FROM, {name}() streams rows)")
        start, stop, step = (
            (0, numbers[0], 1) if len(numbers) == 1 else (*numbers[:2], numbers[2] if len(numbers) > 2 else 1)
        )
        if name == "generate_series":
            stop += 1 if step > 0 else -1
        count = len(range(start, stop, step)) if step else 0
        return _within(name, "a list of", count, 8 * count)
    count = _constant(children[1]) if len(children) > 1 else None
    if not isinstance(count, int):
        raise SizeRefused(f"{name}() with a length that is not an integer constant is refused")
    if name == "repeat":
        return _within(name, "a length of", count, max(count, 0) * sizes[0])
    if name == "list_resize":
        return _within(name, "a length of", count, sizes[0] + max(count, 0) * max(FIXED_BYTES, sum(sizes[2:])))
    return _within(name, "a length of", count, sizes[0] + 4 * max(count, 0))  # lpad, rpad: up to 4 bytes a character


def _within(name: str, what: str, count: int, bound: int) -> int:
    if bound > VALUE_LIMIT_BYTES:
        raise SizeRefused(
            f"{name}() with {what} {count:,} is refused: it would build up to {bound:,} bytes per row in one step,"
            f" which no time or memory limit can stop; the limit is {VALUE_LIMIT_BYTES:,}"
        )
    return bound


def _constant(node: dict) -> object:
    """A literal's value (through casts and a unary minus), or None when it is not a literal."""
    if node.get("class") == "CAST":
        return _constant(node["child"])
    if node.get("class") == "FUNCTION" and node["function_name"] == "-" and len(node["children"]) == 1:
        value = _constant(node["children"][0])
        return -value if isinstance(value, int) else None
    if node.get("class") != "CONSTANT" or node["value"].get("is_null"):
        return None
    value = node["value"]["value"]
    type_id = node["value"]["type"]["id"]
    if type_id in ("INTEGER", "BIGINT", "HUGEINT", "SMALLINT", "TINYINT", "UBIGINT", "UINTEGER", "UHUGEINT"):
        return int(value)
    return value if isinstance(value, str) else None


def _lambda_params(lhs: dict) -> list[str]:
    if lhs.get("class") == "COLUMN_REF":
        return [lhs["column_names"][-1]]
    return [name for child in lhs.get("children", []) for name in _lambda_params(child)]


def _expressions(value: object) -> Iterator[dict]:
    """The outermost expressions and query nodes inside a clause of any shape (dicts and lists)."""
    if isinstance(value, dict):
        if "class" in value or (isinstance(value.get("type"), str) and value["type"] in QUERY_NODES):
            yield value
            return
        for item in value.values():
            yield from _expressions(item)
    elif isinstance(value, list):
        for item in value:
            yield from _expressions(item)
