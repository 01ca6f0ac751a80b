"""Generated hostile reads against a real recorder: every query RPC with generated arguments, raw bytes sent to
each method, SQL strings (generated, and mutations of dangerous statements), media URIs and run ids.

For every input the recorder answers before the deadline with a valid answer or a clear status, never
UNKNOWN/INTERNAL or a traceback; where the right answer is known (a run id's shape, a media URI) it is that
one; no SQL writes a file or reads one; and the recorder still serves afterwards. The generators and checks
are shared with reliability/fuzz.py's long run; this is the fast version.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from hypothesis import given, settings
from hypothesis import strategies as st
from steprec.proto import wire
from steprec.proto.admin.v1 import admin_pb2
from steprec.proto.query.v1 import query_pb2 as pb
from steprec.proto.query.v1 import query_pb2_grpc
from steprec.query import SyncRecorderClient
from steprec.recorder.daemon.auth import ReadableRequests
from steprec.recorder.daemon.process import RecorderProcess
from steprec.recorder.querier.query_service import RecorderQuery
from steprec.recorder.store.duckdb_store import DuckDBStore
from steprec.recorder.store.media import URI_PREFIX

from .test_hostile_ingest import (
    DEADLINE,
    FAST,
    KNOWN_MEDIA_MESSAGE,
    KNOWN_MEDIA_URI,
    Answer,
    GoodRecords,
    export,
    export_beside_good,
    hostile_target,  # noqa: F401 (a fixture)
    int_value,
    log_record,
    request_bytes,
    run_completed,
    run_id_texts,
    snapshot_of,
    status_of,
    string_value,
)

SERVICE = pb.DESCRIPTOR.services_by_name["RecorderQuery"]
METHODS = {method.name: method for method in SERVICE.methods}
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
PRUNE = "/steprec.admin.v1.RecorderAdmin/Prune"
SEEDED_RUN = "seeded-run"
"""A run `seed` stores whole (events, a snapshot referring to KNOWN_MEDIA, a tool call): reads of it must succeed."""
SCRATCH = Path(tempfile.gettempdir()) / f"steprec-hostile-{os.getpid()}"
"""A folder hostile SQL names: a secret file it must not read, and a canary path it must not create."""
SECRET_FILE, CANARY = SCRATCH / "secret.csv", SCRATCH / "canary"
SECRET = hashlib.sha256(str(SCRATCH).encode()).hexdigest()
"""The secret file's content: in no query text, so finding it in an answer means the file was read."""
VIEW_COLUMNS = {
    "runs": ["run_id", "outcome", "metadata", "started_at"], "events": ["run_id", "kind", "seq", "metadata"],
    "snapshots": ["run_id", "snapshot_index", "message_count"], "snapshot_messages": ["run_id", "position", "message"],
    "messages": ["digest", "message", "size_bytes"], "tool_effects": ["run_id", "status", "effect_summary"],
    "tool_effect_records": ["run_id", "status", "seq"], "run_tree": ["root_run_id", "depth", "relation"],
}  # fmt: skip
"""The documented views (docs/sql.md), with some of their columns."""
VIEWS = sorted(VIEW_COLUMNS)

# -- arguments ---------------------------------------------------------------------------------------------------

long_run_ids = st.builds(
    lambda piece, n: (piece * n)[:n], st.sampled_from(["ab", "a.b", "Z_-9"]), st.integers(195, 205)
)
run_ids = st.one_of(st.just(SEEDED_RUN), run_id_texts, long_run_ids)
int64s = st.one_of(st.integers(-3, 3), st.integers(-(2**63), 2**63 - 1))
hex64 = st.text("0123456789abcdef", min_size=64, max_size=64)
digest_lists = st.one_of(
    st.lists(st.binary(min_size=32, max_size=32), max_size=6).map(b"".join),
    st.builds(bytes.__mul__, st.binary(min_size=32, max_size=32), st.integers(2, 4)),  # one digest repeated
    st.binary(max_size=200),  # mostly not whole digests
)
"""ReadMessages' `digests`: unknown digests, repeats, and bytes that are no list of digests at all."""


def _edit(draw: st.DrawFn, text: str) -> str:
    """`text` with a few characters inserted, deleted, replaced or re-cased."""
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        how = draw(st.sampled_from(["insert", "delete", "replace", "case"]))
        piece = draw(st.text(min_size=1, max_size=3))
        text = {
            "insert": text[:at] + piece + text[at:],
            "delete": text[:at] + text[at + 1 :],
            "replace": text[:at] + piece + text[at + 1 :],
            "case": text[:at] + text[at:].swapcase(),
        }[how]
    return text


@st.composite
def edits(draw: st.DrawFn, texts: st.SearchStrategy[str]) -> str:
    return _edit(draw, draw(texts))


TRAVERSALS = [URI_PREFIX + "../../etc/passwd", URI_PREFIX + "..%2f..%2fetc%2fpasswd", "file:///etc/passwd",
              URI_PREFIX + KNOWN_MEDIA_URI[-64:] + "/../../../etc/passwd", URI_PREFIX + "/etc/passwd",
              URI_PREFIX + KNOWN_MEDIA_URI[-64:].upper(), KNOWN_MEDIA_URI + "\n", KNOWN_MEDIA_URI + "\x00",
              " " + KNOWN_MEDIA_URI, URI_PREFIX + "٠" * 64, "s3://bucket/" + KNOWN_MEDIA_URI[-64:]]  # fmt: skip
PREFIXES = ["", "file://", "media+sha256:", "MEDIA+SHA256://", "media+sha512://", "media+sha256:///",
            "http://127.0.0.1/", URI_PREFIX]  # fmt: skip
media_uris = st.one_of(
    st.just(KNOWN_MEDIA_URI),
    hex64.map(URI_PREFIX.__add__),
    st.sampled_from(TRAVERSALS),
    edits(st.just(KNOWN_MEDIA_URI)),
    st.builds(str.__add__, st.sampled_from(PREFIXES), st.one_of(hex64, st.text(max_size=70))),
    st.text(max_size=100),
)


def expected_messages(digests: bytes) -> frozenset[str]:
    """ReadMessages' only right answers for digests no stored message has: nothing to send, or the reason."""
    if len(digests) % 32 or len(set(wire.split_digests(digests))) < len(digests) // 32:
        return frozenset({"INVALID_ARGUMENT"})
    return frozenset({"OK"} if not digests else {"NOT_FOUND"})


def expected_media(uri: str) -> frozenset[str]:
    """FetchMedia's only right answers: the exact URI shape or INVALID_ARGUMENT; stored or NOT_FOUND."""
    digest = uri.removeprefix(URI_PREFIX)
    if not uri.startswith(URI_PREFIX) or len(digest) != 64 or not set(digest) <= set("0123456789abcdef"):
        return frozenset({"INVALID_ARGUMENT"})
    return frozenset({"OK"} if uri == KNOWN_MEDIA_URI else {"NOT_FOUND"})


def expected_for_run_id(run_id: str) -> frozenset[str]:
    """A read by run id: INVALID_ARGUMENT unless the id has the documented shape; the seeded run is found."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", run_id) or ".." in run_id:
        return frozenset({"INVALID_ARGUMENT"})
    return frozenset({"OK"} if run_id == SEEDED_RUN else {"OK", "NOT_FOUND"})


# -- SQL ---------------------------------------------------------------------------------------------------------

DANGEROUS = [
    "INSERT INTO main.runs (run_id) VALUES ('x')", "INSERT INTO runs SELECT * FROM runs",
    "UPDATE main.events SET kind = 'x'", "DELETE FROM main.events", "TRUNCATE main.events", "DROP TABLE main.runs",
    "DROP VIEW recorded.runs", "CREATE TABLE t AS SELECT 1", "CREATE OR REPLACE VIEW recorded.runs AS SELECT 1",
    "CREATE MACRO m(x) AS x", "CREATE SECRET s (TYPE s3, KEY_ID 'x', SECRET 'y')",
    "ALTER TABLE main.runs ADD COLUMN x INT", "ATTACH '{canary}' AS other", "ATTACH ':memory:' AS mem",
    "DETACH main", "USE memory", "COPY main.runs TO '{canary}'", "COPY (SELECT 1) TO '{canary}' (FORMAT parquet)",
    "COPY main.runs FROM '{secret}'", "EXPORT DATABASE '{canary}'", "IMPORT DATABASE '{scratch}'",
    "INSTALL httpfs", "LOAD httpfs", "FORCE INSTALL '{canary}'", "SET enable_external_access = true",
    "SET lock_configuration = false", "RESET lock_configuration", "PRAGMA enable_profiling", "CALL checkpoint()",
    "CHECKPOINT", "VACUUM", "BEGIN TRANSACTION", "COMMIT", "ROLLBACK", "SELECT * FROM read_csv('{secret}')",
    "SELECT * FROM read_csv_auto('{secret}')", "SELECT * FROM read_text('{secret}')",
    "SELECT * FROM read_blob('{secret}')", "SELECT * FROM read_json('{secret}')", "SELECT * FROM '{secret}'",
    "FROM '{secret}'", "SELECT * FROM glob('{scratch}/*')", "SELECT * FROM sniff_csv('{secret}')",
    "SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')", "SELECT * FROM duckdb_secrets()",
    "SELECT * FROM query('SELECT * FROM read_text(''{secret}'')')", "SELECT * FROM query_table('main.runs')",
    "SELECT 1; DROP TABLE main.runs", "SELECT 1; COPY main.runs TO '{canary}'", "SELECT 1 -- ; DROP TABLE main.runs",
    "/* */ DROP TABLE main.runs", "SELECT * FROM range(100000000)", "SELECT count(*) FROM range(1000000000000)",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
    "SELECT * FROM main.runs a, main.events b, main.events c", "SELECT " + "(" * 2000 + "1" + ")" * 2000,
    "SELECT " + "- " * 5000 + "1", "SELECT nextval('s')", "SELECT * FROM pragma_storage_info('runs')",
    "SUMMARIZE main.events", "DESCRIBE main.runs", "SHOW TABLES", "SHOW ALL TABLES", "FROM main.steprec_wal",
    "SELECT * FROM main.runs FOR UPDATE", "PIVOT events ON kind", "SELECT * FROM duckdb_settings()",
    "SELECT current_setting('enable_external_access')", "SELECT getenv('HOME')", "EXPLAIN ANALYZE SELECT 1",
]  # fmt: skip
"""Statements that would write, read files, escape the sandbox or run long, as seeds for mutation."""
AMPLIFIERS = [
    ("SELECT len(range(1000000000))", r"range\(\) with a list of 1,000,000,000 is refused"),
    ("SELECT count(*) FROM (SELECT unnest(generate_series(1, 300000000)))", r"generate_series\(\) with a list of"),
    ("SELECT len(range(TIMESTAMP '2020-01-01', TIMESTAMP '2030-01-01', INTERVAL 1 SECOND))", "integer constants"),
    ("SELECT len(repeat('a', 3000000000))", r"repeat\(\) with a length of 3,000,000,000 is refused"),
    ("SELECT len(repeat([1], 300000000))", r"repeat\(\) with a length of 300,000,000"),
    ("SELECT len(repeat(run_id, n)) FROM runs, (SELECT 10 AS n)", "not an integer constant"),
    ("SELECT len(repeat(message, 1000)) FROM messages", r"repeat\(\) with a length of 1,000"),
    ("SELECT len(lpad('a', 2000000000, 'b'))", r"lpad\(\) with a length of 2,000,000,000"),
    ("SELECT len(rpad('a', 2000000000, 'b'))", r"rpad\(\) with a length of 2,000,000,000"),
    ("SELECT len(list_resize([1], 300000000))", r"list_resize\(\) with a length of 300,000,000"),
    ("SELECT len(array_resize([1], 300000000, 0))", r"list_resize\(\) with a length of 300,000,000"),
    ("SELECT len(printf('%2000000000d', 1))", r"printf\(\) could build a value of 2,000,000,0"),
    ("SELECT len(format('{:>2000000000}', 1))", r"format\(\) could build a value of 2,000,000,0"),
    ("SELECT len(printf('%*d', 2000000000, 1))", "width or precision taken from an argument"),
    ("SELECT len(format('{:>{}}', 1, 2000000000))", "width or precision taken from an argument"),
    ("SELECT len(printf(run_id, 1)) FROM runs", "not a constant string"),
    ("WITH a AS (SELECT repeat('a', 100000) s) SELECT len(regexp_replace(s, '', repeat('b', 1000), 'g')) FROM a",
     r"regexp_replace\(\) could build"),
    ("SELECT len(replace(message, 'a', message)) FROM messages", r"replace\(\) could build"),
    ("SELECT len(list_reduce(list_transform(range(40), x -> 'a'), (a, x) -> a || a))",
     "copies its accumulator more than once"),
    ("SELECT len(reduce(list_transform(range(40), x -> 'a'), (a, x) -> repeat(a, 2)))",
     "copies its accumulator more than once"),
    ("WITH a AS (SELECT range(10000) l) SELECT len(flatten(list_transform(l, x -> l))) FROM a",
     "a lambda may use only its own parameters, not l"),
    ("SELECT len(flatten([l FOR x IN l])) FROM (SELECT range(10000) l)", "a lambda may use only its own parameters"),
    ("WITH a AS (SELECT repeat('a', 1000) s), b AS (SELECT s||s||s||s s FROM a), c AS (SELECT s||s||s||s s FROM b),"
     " d AS (SELECT s||s||s||s s FROM c), e AS (SELECT s||s||s||s s FROM d) SELECT len(s||s||s||s) FROM e",
     "the \\|\\| operator could build a value"),
    ("SELECT len(bin(bin(bin(bin(message))))) FROM messages", r"bin\(\) could build a value"),
    ("SELECT len(" + " || ".join(["message"] * 100) + ") FROM messages", "could build a value"),
    ("SELECT * FROM query('SELECT len(repeat(''a'', 3000000000))')", r"query\(\) runs SQL text"),
]  # fmt: skip
"""Queries that would build one value of gigabytes in a single function call, which neither DuckDB's interrupt
nor its memory limit stops, each with the reason it must be refused for (recorder/sql_sizes.py)."""
DANGEROUS = [seed.format(canary=CANARY, secret=SECRET_FILE, scratch=SCRATCH) for seed in DANGEROUS]
DANGEROUS += [query for query, _ in AMPLIFIERS]
WRAPPERS = ["{}", "{};", "SELECT 1; {}", "{}; SELECT 1", "WITH x AS ({}) SELECT * FROM x", "SELECT * FROM ({})",
            "EXPLAIN {}", "DESCRIBE {}", "SUMMARIZE {}", "/* {} */ SELECT 1", "SELECT '{}'"]  # fmt: skip
SEPARATORS = [" ", "  ", "\t", "\n", "/**/", " /* x */ ", "--\n"]


@st.composite
def mutated_statements(draw: st.DrawFn) -> str:
    """A dangerous seed, re-spaced, re-commented, re-cased, wrapped and edited."""
    words = draw(st.sampled_from(DANGEROUS)).split(" ")
    text = words[0] + "".join(draw(st.sampled_from(SEPARATORS)) + word for word in words[1:])
    text = draw(st.sampled_from(WRAPPERS)).format(text)
    return _edit(draw, text) if draw(st.booleans()) else text


@st.composite
def generated_selects(draw: st.DrawFn) -> str:
    """A SELECT over one view, its own columns filtered, grouped, sorted: most run, some do not parse."""
    view = draw(st.sampled_from(VIEWS))
    columns = draw(st.lists(st.sampled_from(VIEW_COLUMNS[view]), min_size=1, max_size=3, unique=True))
    first, text = columns[0], draw(st.text(max_size=12))
    picked = draw(st.sampled_from([", ".join(columns), "count(*)", f"list({first})", "*"]))
    quoted = text.replace("'", "''")
    where = draw(st.sampled_from([f"{first} IS NOT NULL", f"{first}::VARCHAR LIKE '{quoted}%'", text, "true"]))
    source = draw(st.sampled_from([view, f"main.{view}"]))
    tail = draw(st.sampled_from(["", "GROUP BY ALL", "ORDER BY ALL", "ORDER BY 1 DESC"]))
    return f"SELECT {picked} FROM {source} WHERE {where} {tail} LIMIT {draw(st.integers(-1, 10_000))}"


AMPLIFIER_TEMPLATES = ["repeat('ab', {n})", "repeat([1, 2], {n})", "lpad('a', {n}, 'b')", "rpad(run_id, {n}, '.')",
                       "list_resize([1], {n})", "array_resize([1], {n}, 0)", "range({n})",
                       "generate_series(-1, {n}, 2)", "printf('%{n}d', 1)", "format('{{:<{n}}}', 'x')",
                       "repeat(run_id, {n})", "regexp_replace(run_id, '', repeat('b', {n}), 'g')"]  # fmt: skip
amplified_queries = st.builds(
    lambda template, n, wrap: wrap.format(template.format(n=n)),
    st.sampled_from(AMPLIFIER_TEMPLATES),
    st.one_of(st.integers(-2, 20_000), st.integers(-(2**63), 2**63 - 1), st.sampled_from([2**31, 3 * 10**9, 10**30])),
    st.sampled_from(["SELECT len({}) FROM runs", "SELECT count(*) FROM (SELECT unnest({}) FROM runs)",
                     "WITH a AS (SELECT {} AS v FROM runs) SELECT len(v || v) FROM a"]),
)  # fmt: skip
"""A function whose result size an argument sets, with that argument small, huge or past 64 bits."""
sql_queries = st.one_of(
    mutated_statements(), generated_selects(), st.sampled_from(DANGEROUS), amplified_queries, st.text(max_size=200)
)
max_rows = st.one_of(st.integers(0, 100), int64s, st.sampled_from([1_000_000, 1_000_001]))
timeouts = st.one_of(st.floats(0.05, 1.0), st.sampled_from([-1.0, math.nan, math.inf, -math.inf, 300.001, 5e-324]))
"""A time limit of at most a second, or one to refuse: never the 10 s default, so no query holds the run up."""

# -- calls -------------------------------------------------------------------------------------------------------

FIELD_VALUES = {
    "run_id": run_ids, "parent_run_id": run_ids, "forked_from_run_id": run_ids,
    "conversation_id": st.text(max_size=20), "agent_name": st.text(max_size=20),
    "outcome": st.one_of(st.sampled_from(["running", "completed", "failed"]), st.text(max_size=10)),
    "page_size": st.one_of(st.integers(1, 50), st.integers(1, 50), st.just(0), st.integers(-(2**31), 2**31 - 1)),
    "page_token": st.one_of(st.from_regex(r"-?\d{1,21}:-?\d{1,21}", fullmatch=True), st.text(max_size=30)),
    "started_at_or_after_unix_nano": int64s, "started_before_unix_nano": int64s, "snapshot_index": int64s,
    "tool_call_id": st.one_of(st.just("c1"), st.text(max_size=20)),
    "uri": media_uris, "query": sql_queries, "max_rows": max_rows, "timeout_seconds": timeouts,
    "view": st.one_of(st.sampled_from(VIEWS), st.text(max_size=20), edits(st.sampled_from(VIEWS))),
    "ancestors": st.booleans(), "include_interrupted": st.booleans(), "unresolved_only": st.booleans(),
    "digests_only": st.booleans(), "digests": digest_lists,
}  # fmt: skip
"""Each request field's values: the right kind of value, edge values, and strangers' text."""
ALWAYS = {"page_size", "timeout_seconds"}
"""Fields always drawn: an absent page size reads every run, an absent time limit is the 10 s default."""


@dataclass
class Call:
    """One generated call: the method, the bytes sent, and the statuses that are right for it (None: any clear one)."""

    method: str
    payload: bytes
    expect: frozenset[str] | None = None


def request_for(method: str) -> st.SearchStrategy[Message]:
    fields = {f.name: FIELD_VALUES[f.name] for f in METHODS[method].input_type.fields}
    cls = getattr(pb, METHODS[method].input_type.name)
    return st.fixed_dictionaries(
        {k: v for k, v in fields.items() if k in ALWAYS}, optional={k: v for k, v in fields.items() if k not in ALWAYS}
    ).map(lambda values: cls(**values))


def _call(method: str, request: Message, expect: frozenset[str] | None = None) -> Call:
    return Call(method, request.SerializeToString(), expect)


query_calls = st.tuples(*(request_for(m).map(lambda r, m=m: _call(m, r)) for m in METHODS)).map(list)
"""One call of every query RPC, each request field generated."""
RUN_ID_METHODS = [m.name for m in SERVICE.methods if m.input_type.fields_by_name.get("run_id")]


def _reads_of(run_id: str) -> list[Call]:
    calls = []
    for method in RUN_ID_METHODS:
        request = getattr(pb, METHODS[method].input_type.name)(run_id=run_id)
        if method == "GetToolEffect":
            request.tool_call_id = "c1"
        calls.append(_call(method, request, expected_for_run_id(run_id)))
    return calls


run_id_calls = run_ids.map(_reads_of)
"""A generated run id sent to every read by run id, each with its one right kind of answer."""
media_calls = st.lists(
    media_uris.map(lambda uri: _call("FetchMedia", pb.FetchMediaRequest(uri=uri), expected_media(uri))),
    min_size=1, max_size=8,
)  # fmt: skip
message_calls = st.lists(
    digest_lists.map(lambda d: _call("ReadMessages", pb.ReadMessagesRequest(digests=d), expected_messages(d))),
    min_size=1, max_size=4,
)  # fmt: skip
sql_calls = st.lists(
    st.builds(lambda query, rows, limit: _call("Sql", pb.SqlRequest(query=query, max_rows=rows, timeout_seconds=limit)),
              sql_queries, max_rows, timeouts),
    min_size=1, max_size=4,
)  # fmt: skip


def _expected_prune(request: admin_pb2.PruneRequest) -> frozenset[str]:
    """Prune's only right answer: INVALID_ARGUMENT without an age or a conversation (it would remove every run)."""
    ok = request.HasField("started_before_unix_nano") or request.HasField("conversation_id")
    return frozenset({"OK"} if ok else {"INVALID_ARGUMENT"})


def _prune(fields: dict) -> Call:
    request = admin_pb2.PruneRequest(**fields)
    return Call(PRUNE, request.SerializeToString(), _expected_prune(request))


PRUNED_CONVERSATION = st.text(max_size=20).map("pruned-".__add__)
"""The conversations a prune that removes may name: no run the fuzz must read back belongs to one."""
prune_calls = st.lists(
    st.one_of(
        st.fixed_dictionaries({"dry_run": st.just(True)}, optional={"started_before_unix_nano": int64s,
                              "conversation_id": st.one_of(st.text(max_size=30), st.just("x" * 70_000))}),
        st.fixed_dictionaries({"dry_run": st.just(False), "conversation_id": PRUNED_CONVERSATION},
                              optional={"started_before_unix_nano": int64s}),
        st.just({}),
    ).map(_prune),
    min_size=1, max_size=4,
)  # fmt: skip
"""Admin Prune with generated ages (negative, 0, past 2^62) and conversations; only a dry run may match everything."""
raw_calls = st.one_of(
    st.binary(max_size=512), query_calls.map(lambda calls: calls[0].payload[: len(calls[0].payload) // 2] + b"\xff")
).map(lambda payload: [Call(method, payload) for method in [*METHODS, HEALTH_CHECK, PRUNE]])
"""Bytes that are not a request message (or are one only by chance), sent to every method and the health check."""

# -- making a call, and checking the answer ------------------------------------------------------------------------


def _path(method: str) -> str:
    return method if method.startswith("/") else f"/{SERVICE.full_name}/{method}"


def _streams(method: str) -> bool:
    return not method.startswith("/") and METHODS[method].server_streaming


def _reply_problem(method: str, payload: bytes, replies: list[bytes]) -> str | None:
    """What is wrong with an OK answer: protobuf that does not parse, Arrow that does not read, a media blob
    that is not its URI's, a secret file's content."""
    if any(SECRET.encode() in reply for reply in replies):
        return "an answer holds the secret file's content"
    if method == PRUNE:
        counts = admin_pb2.PruneResponse.FromString(replies[0])
        negative = [f.name for f, value in counts.ListFields() if value < 0]
        return f"Prune answered negative counts: {negative}" if negative else None
    if method.startswith("/"):
        return None
    output = getattr(pb, METHODS[method].output_type.name)
    messages = [output.FromString(reply) for reply in replies]
    if output is pb.ArrowChunk:
        unit = b""
        for chunk in messages:
            unit += chunk.arrow_ipc
            if chunk.batch_end:
                pa.ipc.open_stream(unit).read_all()
                unit = b""
        if not messages or unit:
            return "an Arrow answer that does not end with a whole IPC stream"
    elif output is pb.MediaChunk:
        data = b"".join(chunk.data for chunk in messages)
        uri = pb.FetchMediaRequest.FromString(payload).uri
        if hashlib.sha256(data).hexdigest() != uri.removeprefix(URI_PREFIX) or messages[0].size_bytes != len(data):
            return f"{uri} answered with other bytes"
    elif output is pb.SnapshotChunk:
        pieces = [chunk.message_piece for chunk in messages]
        for text in [m for chunk in messages for m in chunk.messages_json] + (
            [b"".join(pieces)] if any(pieces) else []
        ):
            json.loads(text)
    return None


def invoke(channel: grpc.Channel, call: Call) -> Answer:
    """Send a call's bytes through a generic channel method and judge the answer."""
    path = _path(call.method)
    try:
        if _streams(call.method):
            replies = list(channel.unary_stream(path)(call.payload, timeout=DEADLINE))
        else:
            replies = [channel.unary_unary(path)(call.payload, timeout=DEADLINE)]
    except grpc.RpcError as error:
        answer = status_of(error)
    else:
        try:
            answer = Answer("OK", problem=_reply_problem(call.method, call.payload, replies))
        except Exception as error:  # an answer that does not parse is the finding, not the fuzzer's crash
            answer = Answer("OK", problem=f"an answer that does not read: {error!r}"[:300])
    if answer.problem is None and call.expect is not None and answer.status not in call.expect:
        answer.problem = f"{call.method} answered {answer.status}, expected one of {sorted(call.expect)}"
    return answer


def seed(channel: grpc.Channel) -> None:
    """A whole run to find, and the scratch folder hostile SQL aims at (holding only the secret file)."""
    SCRATCH.mkdir(mode=0o700, exist_ok=True)
    SECRET_FILE.write_text(f"token\n{SECRET}\n")
    lineage = {wire.RUN_ID: string_value(SEEDED_RUN), wire.STEP_INDEX: int_value(0)}
    started = log_record(wire.EVENT_PREFIX + "run_started", {**lineage, wire.REGISTRATION_ID: string_value("seeded")})
    call = {wire.EFFECT_STATUS: "started", wire.TOOL_CALL_ID: "c1", wire.TOOL_NAME: "t"}
    effect = log_record(wire.TOOL_EFFECT, {**lineage, **{k: string_value(v) for k, v in call.items()}})
    records = [started, snapshot_of(SEEDED_RUN, KNOWN_MEDIA_MESSAGE), effect, run_completed(SEEDED_RUN)]
    answer, response = export(channel, request_bytes(*records))
    assert answer.status == "OK" and not response.partial_success.error_message, response


def scratch_untouched() -> bool:
    """No hostile SQL made a file: the scratch folder holds the secret file and nothing else."""
    return sorted(SCRATCH.iterdir()) == [SECRET_FILE]


def remove_scratch() -> None:
    SECRET_FILE.unlink(missing_ok=True)
    SCRATCH.rmdir()


# -- the fast tests ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeded(hostile_target) -> Iterator[tuple[RecorderProcess, grpc.Channel]]:  # noqa: F811
    seed(hostile_target[1])
    yield hostile_target
    assert scratch_untouched()
    remove_scratch()


def _invoked(seeded, calls: list[Call]) -> None:
    recorder, channel = seeded
    for call in calls:
        answer = invoke(channel, call)
        assert answer.problem is None, (call, answer)
    assert recorder.process.poll() is None


SOME = settings(FAST, max_examples=40)
"""Each example makes one to a dozen calls."""


@pytest.mark.parametrize(
    "strategy",
    [query_calls, run_id_calls, media_calls, message_calls, sql_calls, prune_calls],
    ids=["query-rpcs", "run-ids", "media-uris", "message-digests", "sql", "prune"],
)
@SOME
@given(data=st.data())
def test_generated_reads_get_a_valid_answer_or_a_clear_refusal(seeded, strategy, data) -> None:
    """Every query RPC with generated fields; run ids and media URIs, each answered as its shape says; SQL that
    must neither write, nor read a file, nor crash."""
    _invoked(seeded, data.draw(strategy))


@SOME
@given(calls=raw_calls)
def test_raw_bytes_to_any_method_never_crash_or_hang(seeded, calls: list[Call]) -> None:
    recorder, channel = seeded
    for call in calls:
        answer = invoke(channel, call)
        assert answer.status != "HANG" and recorder.process.poll() is None, answer


def test_raw_bytes_to_any_method_are_refused_as_invalid_argument(seeded) -> None:
    for method in [*METHODS, HEALTH_CHECK, PRUNE]:
        assert invoke(seeded[1], Call(method, b"\xff\xff\xff")).status == "INVALID_ARGUMENT", method


async def test_readable_requests_refuses_unreadable_bytes_and_passes_the_rest(tmp_path: Path) -> None:
    """The fix the test above waits for, on an in-process server: every method, unary and streamed, and grpc's
    health service (whose Watch writes through its context instead of yielding)."""
    store = DuckDBStore(tmp_path / "steprec.duckdb")
    server = grpc.aio.server(interceptors=[ReadableRequests()])
    server.add_generic_rpc_handlers((RecorderQuery(store).handler(),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            for method in [*METHODS, HEALTH_CHECK, "/grpc.health.v1.Health/Watch"]:
                stream = method.endswith("Watch") or _streams(method)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    call = (channel.unary_stream if stream else channel.unary_unary)(_path(method))(b"\xff\xff\xff")
                    _ = [reply async for reply in call] if stream else await call
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, refused.value)
                assert "is not one" in refused.value.details()
            stub = query_pb2_grpc.RecorderQueryStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await stub.GetRun(pb.GetRunRequest(run_id="nobody"))
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
            chunks = [chunk async for chunk in stub.Sql(pb.SqlRequest(query="SELECT 42 AS n"))]
            assert pa.ipc.open_stream(chunks[0].arrow_ipc).read_all().column("n").to_pylist() == [42]
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            watch.cancel()
    finally:
        await server.stop(None)
        store.close()


def test_sql_interrupted_while_its_rows_stream_is_a_time_limit_not_unknown(seeded) -> None:
    """An interrupt that lands while Arrow reads the result surfaces as OSError, not a duckdb.Error: it was
    answered UNKNOWN ("Unexpected OSError: INTERRUPT Error") instead of the time limit."""
    query = "SELECT md5(md5(md5(md5(range::VARCHAR)))) FROM range(1000000000)"
    call = _call(
        "Sql", pb.SqlRequest(query=query, max_rows=1_000_000, timeout_seconds=0.1), frozenset({"DEADLINE_EXCEEDED"})
    )
    _invoked(seeded, [call])


def test_many_snapshots_of_one_index_do_not_multiply_snapshot_messages(seeded) -> None:
    """20 copies of a five-snapshot chain in one run: the view once joined bases by index alone, one chain per
    combination of copies (3.4 million rows here, billions a few levels deeper, all in memory)."""
    recorder, channel = seeded
    chain = [snapshot_of("dups", "{}"), *(snapshot_of("dups", index=i, base=i - 1, keep=1) for i in range(1, 5))]
    assert export(channel, request_bytes(*chain * 20))[0].problem is None
    with SyncRecorderClient(recorder.endpoint) as client:
        rows = client.sql("SELECT count(*) AS n FROM snapshot_messages WHERE run_id = 'dups'", timeout_seconds=5)
    assert rows.column("n")[0].as_py() == 100  # one message in each of the 100 snapshots
    _invoked(seeded, [_call("ExportView", pb.ExportViewRequest(view="snapshot_messages"), frozenset({"OK"}))])


def test_a_snapshot_on_a_base_numbered_higher_reads_back_whole(seeded) -> None:
    _, channel = seeded
    first, second = (json.dumps({"kind": "request", "parts": [], "n": n}) for n in (1, 2))
    base = snapshot_of("renumbered", first, index=2**30)
    delta = snapshot_of("renumbered", second, index=2, base=2**30, keep=1)
    assert export(channel, request_bytes(base, delta))[0].problem is None
    request = pb.ReadSnapshotRequest(run_id="renumbered", snapshot_index=2)
    chunks = list(query_pb2_grpc.RecorderQueryStub(channel).ReadSnapshot(request, timeout=DEADLINE))
    assert [json.loads(text)["n"] for chunk in chunks for text in chunk.messages_json] == [1, 2]


def _run_started(run_id: str, parent: str | None = None, fork_of: str | None = None):
    links = {wire.PARENT_RUN_ID: parent, wire.FORKED_FROM_RUN_ID: fork_of}
    attrs = {wire.RUN_ID: run_id, wire.REGISTRATION_ID: run_id, **{k: v for k, v in links.items() if v}}
    fields = {wire.STEP_INDEX: int_value(0), **{k: string_value(v) for k, v in attrs.items()}}
    return log_record(wire.EVENT_PREFIX + "run_started", fields)


def test_run_links_in_a_cycle_or_a_lattice_are_walked_once(seeded) -> None:
    """Parent and fork links a stranger sends may form a cycle, or a lattice where each run is both child and fork
    of the runs before it (paths to the 40th: a Fibonacci number). Trees and the run_tree view list each run once,
    at its least depth; the view once made a row per path (13 GB in 20 s), the walk went round a cycle 10,000 times."""
    recorder, channel = seeded
    cycle = [_run_started("cyc-a", "cyc-c"), _run_started("cyc-b", "cyc-a"), _run_started("cyc-c", "cyc-b", "cyc-a")]
    lattice = [_run_started("lat-0"), _run_started("lat-1", "lat-0")]
    lattice += [_run_started(f"lat-{i}", f"lat-{i - 1}", f"lat-{i - 2}") for i in range(2, 40)]
    assert export(channel, request_bytes(*cycle, *lattice))[0].problem is None
    with SyncRecorderClient(recorder.endpoint) as client:
        pairs = client.sql(
            "SELECT root_run_id, count(*) AS n, max(depth) AS deepest FROM run_tree"
            " WHERE root_run_id IN ('cyc-a', 'lat-0') GROUP BY ALL ORDER BY ALL",
            timeout_seconds=5,
        )
        assert pairs.to_pylist() == [{"root_run_id": "cyc-a", "n": 3, "deepest": 1},
                                     {"root_run_id": "lat-0", "n": 40, "deepest": 20}]  # fmt: skip
        assert client.descendants("cyc-a").column("depth").to_pylist() == [0, 1, 1]  # its child, and its fork
        assert [run.run_id for run in client.ancestors("cyc-a")] == ["cyc-c", "cyc-b"]
        assert client.descendants("lat-0").num_rows == 40


def _peak_rss_mib(pid: int) -> float:
    return int(re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())[1]) / 1024


def _serve_others(endpoint: str, stop: threading.Event, latencies: list[float]) -> None:
    """Another client's reads, one every 50 ms, each timed, until `stop`."""
    with SyncRecorderClient(endpoint) as client:
        while not stop.wait(0.05):
            started = time.monotonic()
            client.sql("SELECT count(*) AS n FROM runs", timeout_seconds=5)
            latencies.append(time.monotonic() - started)


def _wait_for(condition, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {seconds:.0f} s"
        time.sleep(0.01)


def test_queries_that_build_huge_values_are_refused_at_once_while_others_are_served(seeded) -> None:
    """Each AMPLIFIERS query once grew the recorder by GBs past its 1 s limit (one call DuckDB does not interrupt).
    Now each is refused with its reason within the limit, the recorder's peak RSS stays put, and another client
    reading meanwhile is answered throughout."""
    recorder, _ = seeded
    peak_before, stop, latencies = _peak_rss_mib(recorder.process.pid), threading.Event(), []
    other = threading.Thread(target=_serve_others, args=(recorder.endpoint, stop, latencies))
    other.start()
    try:
        _wait_for(lambda: latencies, "the other client's first read")
        with SyncRecorderClient(recorder.endpoint) as client:
            for query, reason in AMPLIFIERS:
                started = time.monotonic()
                with pytest.raises(ValueError, match=reason):
                    client.sql(query, timeout_seconds=1)
                assert time.monotonic() - started < 1.5, query
        answered = len(latencies)
        _wait_for(lambda: len(latencies) > answered, "the other client's read after the attacks")
    finally:
        stop.set()
        other.join()
    assert _peak_rss_mib(recorder.process.pid) - peak_before < 256
    assert latencies and max(latencies) < 2.0


def test_prunes_while_ingesting_remove_only_their_conversation(seeded) -> None:
    """Prunes (dry runs over every run, and real ones of a conversation) race good records and runs started in
    that conversation: every call answers OK, the pruned conversation's runs go, every good record stays."""
    recorder, channel = seeded
    good, stop, answers = GoodRecords(), threading.Event(), []

    def ingest() -> None:
        for i in itertools.count():
            if stop.is_set():
                return
            started = log_record(wire.EVENT_PREFIX + "run_started", {
                wire.RUN_ID: string_value(f"doomed-{i}"), wire.REGISTRATION_ID: string_value(f"doomed-{i}"),
                wire.CONVERSATION_ID: string_value("pruned-race"), wire.STEP_INDEX: int_value(0)})  # fmt: skip
            answers.append(export_beside_good(channel, [started], good))

    writer = threading.Thread(target=ingest)
    writer.start()
    try:
        for i in range(20):
            fields = (
                {"dry_run": True, "started_before_unix_nano": 2**63 - 1}
                if i % 2
                else {"conversation_id": "pruned-race"}
            )
            answers.append(invoke(channel, _prune(fields)))
    finally:
        stop.set()
        writer.join()
    answers.append(invoke(channel, _prune({"conversation_id": "pruned-race"})))
    assert [a for a in answers if a.problem or a.status != "OK"] == []
    assert good.stored(recorder.endpoint) == len(good.run_ids)
    with SyncRecorderClient(recorder.endpoint) as client:
        left = client.sql("SELECT count(*) AS n FROM runs WHERE conversation_id = 'pruned-race'", timeout_seconds=5)
    assert left.column("n")[0].as_py() == 0
