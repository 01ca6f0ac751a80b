"""Hostile input, the long run (issue 6): at least 100,000 generated inputs against one real recorder.

The generators and the checks are the normal suite's (tests/test_hostile_ingest.py for OTLP ingest,
tests/test_hostile_queries.py for the query service); this module runs them at report size. hypothesis
drives them in generation mode only (no shrinking, no example database), so a finding is counted and
the run goes on instead of stopping at the first one. Each category runs in rounds of `@given` until
its budget of inputs is spent.

An input is one generated OTLP log record, one whole hostile Export payload (random bytes, deep
nesting, invalid UTF-8, cut or padded requests), one frame, tail, flipped byte or `.pos` text of a
journal segment planted in a folder the recorder adopts, or one query call. Drawing a record with hypothesis
takes milliseconds, so each drawn record is followed by up to 9 cheap mutants of it (`mutate`), and
a request carries up to a few hundred, with a good record after every 8. Query strategies draw a
list of calls per example (one run id sent to every read by run id, one byte string to every
method). Good records also go in between the other inputs, and at the end every good record
acknowledged must read back. Three generated values are in flight at once, so drawing the next one
overlaps the recorder's work on the last.

When atheris is importable, `decode_request` (the OTLP decoding trust boundary) is also fuzzed
in-process, coverage-guided, in a child process (atheris ends the process it runs in).

    python -m reliability.fuzz [--quick]     # prints the markdown section; reliability/run.py calls main()
"""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IN_FLIGHT = 3
"""Generated values being sent at once: hypothesis draws the next while the recorder answers (2 cores), and
never more SQL at once than the recorder runs (4), so a busy refusal is the fuzz's, not the load's."""
MUTANTS = 9
"""At most this many mutants follow each drawn OTLP record (`mutate`): drawing is the slow part of the run."""
GOOD_EVERY = 50
"""Inputs between two good records sent to the recorder, where the inputs themselves carry none."""
ATHERIS_RUNS = {True: 5_000, False: 1_000_000}


@dataclass
class Tally:
    """What one category sent and what came back."""

    inputs: int = 0
    generated: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    problems: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    """The first input of each kind of problem."""
    seconds: float = 0.0

    def problem(self, kind: str, sent: object) -> None:
        key = _problem_key(kind)
        self.problems[key] += 1
        self.examples.setdefault(key, f"{kind[:300]} ← {sent!r:.300}")


@dataclass(frozen=True)
class Category:
    name: str
    what: str
    strategy: object
    send: Callable[[Target, object], list[tuple[int, object, object]]]
    """Sends one generated value; returns per call made how many inputs it held, the Answer and what was sent."""
    budget: int


class Target:
    """The recorder under fuzz, with its channel and the good records sent to it; restarted if it dies."""

    def __init__(self, folder: Path) -> None:
        from steprec.recorder.daemon.process import RecorderProcess

        from tests.test_hostile_ingest import GoodRecords

        self.journal = folder / "journal"
        self.journal.mkdir(mode=0o700)
        self.recorder = RecorderProcess(folder / "recorder", extra_args=("--adopt-journals", str(self.journal))).start()
        self.channel = self._channel()
        self.good = GoodRecords()
        self.crashes = 0
        self.since_good = 0

    def _channel(self):
        import grpc

        return grpc.insecure_channel(self.recorder.endpoint)

    def check_alive(self) -> None:
        """A dead recorder is a crash: counted, then restarted on the same data so the run goes on."""
        if self.recorder.process.poll() is None:
            return
        self.crashes += 1
        self.channel.close()
        self.recorder.start()
        self.channel = self._channel()

    def send_good(self) -> object:
        from tests.test_hostile_ingest import export_beside_good

        self.since_good = 0
        return export_beside_good(self.channel, [], self.good)

    def close(self) -> None:
        self.channel.close()
        self.recorder.stop()


def _records(target: Target, bad: list) -> list[tuple[int, object, object]]:
    from tests.test_hostile_ingest import export_beside_good

    return [(len(bad), export_beside_good(target.channel, bad, target.good, every=8), bad)]


def _payload(target: Target, payload: bytes) -> list[tuple[int, object, object]]:
    from tests.test_hostile_ingest import export

    return [(1, export(target.channel, payload)[0], payload)]


def _segments(target: Target, segments: list) -> list[tuple[int, object, object]]:
    from tests.test_hostile_ingest import adopt_segments

    return [(sum(segment.inputs() for segment in segments), adopt_segments(target.journal, segments, target.good),
             segments)]  # fmt: skip


def _queries(target: Target, calls: list) -> list[tuple[int, object, object]]:
    from tests.test_hostile_queries import invoke

    return [(1, invoke(target.channel, call), call) for call in calls]


def categories(quick: bool) -> list[Category]:
    """The categories and their budgets (105,000 inputs in all at report size, 2,100 quick)."""
    from hypothesis import strategies as st

    from tests import test_hostile_ingest as ingest
    from tests import test_hostile_queries as queries

    scale = 50 if quick else 1
    return [
        Category("OTLP records", "plausible steprec records with fields right, missing or mistyped; any record at all;"
                 " huge attribute counts; forged idempotency keys; unknown messages and bases; spoiled fragment"
                 " series", ingest.hostile_batches(20, mutants=MUTANTS), _records, 50_000 // scale),
        Category("OTLP payloads", "random bytes, AnyValue nested up to 3,000 deep, invalid UTF-8, valid requests"
                 " cut short or padded", ingest.raw_requests, _payload, 5_000 // scale),
        Category("journal segments", "segments planted in a folder the recorder adopts: frames of hostile records"
                 " or unreadable requests after a good one, torn and random tails, a flipped byte, any .pos text",
                 st.lists(ingest.hostile_segments, min_size=1, max_size=8), _segments, 3_000 // scale),
        Category("query RPCs", "every RecorderQuery method, each request field generated",
                 queries.query_calls, _queries, 15_000 // scale),
        Category("run ids", "every read by run id; answers checked against the id's shape",
                 queries.run_id_calls, _queries, 10_000 // scale),
        Category("media URIs", "path traversal, other schemes, wrong digests, edits of a stored URI; answers"
                 " checked", queries.media_calls, _queries, 5_000 // scale),
        Category("message digests", "ReadMessages with unknown, repeated and torn digests; answers checked",
                 queries.message_calls, _queries, 2_000 // scale),
        Category("SQL", "mutated writes, ATTACH/COPY/file reads/extensions/SET, long and huge queries, functions"
                 " that build huge values (repeat, lpad, range, list_resize, printf widths, lambdas, reduce),"
                 " generated SELECTs, random text", queries.sql_calls, _queries, 10_000 // scale),
        Category("admin Prune", "dry runs with any age (negative, 0, past 2^62) or conversation, prunes of"
                 " conversations no checked run is in, no filter at all", queries.prune_calls, _queries,
                 2_000 // scale),
        Category("raw bytes to query methods", "bytes that are not the request message, to every method and the"
                 " health check", queries.raw_calls, _queries, 5_000 // scale),
    ]  # fmt: skip


def _problem_key(problem: str) -> str:
    """Problems grouped by kind: digits and quoted values folded, so one cause counts once."""
    return re.sub(r"'[^']*'|\d+", "…", problem)[:160]


def run_category(target: Target, category: Category) -> Tally:
    """Generate and send until the category's budget of inputs is spent, in rounds of hypothesis examples."""
    from hypothesis import HealthCheck, Phase, given, settings

    tally = Tally()
    pending: deque[tuple[object, Future]] = deque()

    def settle() -> None:
        """Count the oldest call in flight, and interleave a good record when it is due."""
        value, future = pending.popleft()
        try:
            results = future.result()
        except Exception as error:  # a fault of the fuzzer's own checks is reported, not fatal to the run
            tally.problem(f"fuzzer error: {error!r}", value)
            results = [(1, None, value)]
        tally.generated += 1
        for count, answer, sent in results:
            tally.inputs += count
            target.since_good += count
            if answer is not None:
                tally.statuses[answer.status] += 1
                tally.refusals.update(answer.refusals)
                if answer.problem:
                    tally.problem(answer.problem, sent)
        if category.send is not _records and target.since_good >= GOOD_EVERY:
            good = target.send_good()
            if good.problem:
                tally.problem(f"good record: {good.problem}", value)
        target.check_alive()

    def one(value: object) -> None:
        pending.append((value, calls.submit(category.send, target, value)))
        while len(pending) >= IN_FLIGHT:
            settle()

    started = time.monotonic()
    with ThreadPoolExecutor(IN_FLIGHT) as calls:
        for _ in range(1000):  # rounds; the bound only guards against a strategy that yields no inputs
            remaining = category.budget - tally.inputs
            if remaining <= 0:
                break
            per_example = tally.inputs / tally.generated if tally.inputs else 1.0
            examples = min(max(20, math.ceil(remaining / per_example)), 100 if not tally.generated else 10**9)

            @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck))  # fmt: skip
            @given(category.strategy)
            def round_of(value: object) -> None:
                if tally.inputs < category.budget:
                    one(value)

            round_of()
            while pending:
                settle()
    tally.seconds = time.monotonic() - started
    return tally


def _peak_rss_mib(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(match[1]) / 1024 if match else None


def _atheris(quick: bool) -> str:
    """The coverage-guided run of decode_request, in a child process; one line for the report."""
    if importlib.util.find_spec("atheris") is None:
        return "not run: atheris is not installed in this venv (`pip install atheris`; it installs on Python 3.11)"
    runs = ATHERIS_RUNS[quick]
    with tempfile.TemporaryDirectory(prefix="steprec-atheris-") as folder:
        child = subprocess.run([sys.executable, "-m", "reliability.fuzz", "--atheris", str(runs), folder],
                               cwd=ROOT, capture_output=True, text=True, timeout=1800)  # fmt: skip
    done = re.search(r"Done (\d+) runs in (\d+) second", child.stderr)
    covered = re.findall(r"cov: (\d+) ft: (\d+)", child.stderr)
    if child.returncode == 0 and done:
        edges = f", {covered[-1][0]} coverage edges, {covered[-1][1]} features" if covered else ""
        return f"{int(done[1]):,} inputs in {done[2]} s{edges}: no exception, every decoded record storable"
    crash = [line for line in child.stderr.splitlines() if "Error" in line or "Exception" in line][-3:]
    return f"FAILED (exit {child.returncode}): " + " / ".join(crash)[:500]


def _atheris_child(runs: int, folder: str) -> None:
    """`python -m reliability.fuzz --atheris RUNS FOLDER`: libFuzzer over decode_request until RUNS inputs.

    Beyond not raising, every record decoded must be one the store can take: each int within its 32-bit
    column (times within 64-bit signed), and every record accounted for as decoded or refused.
    """
    import dataclasses

    import atheris

    with atheris.instrument_imports(include=["steprec.recorder.ingest.decode"]):
        from steprec.recorder.ingest.decode import Lineage, decode_request
    from google.protobuf.message import DecodeError
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from steprec.proto import wire

    from tests.test_hostile_ingest import (
        KNOWN_MEDIA_MESSAGE,
        fragment_series,
        request_bytes,
        run_completed,
        snapshot_of,
        steprec_records,
    )

    def check(value: object) -> None:
        for item in dataclasses.fields(value):
            number = getattr(value, item.name)
            if dataclasses.is_dataclass(number):
                check(number)
            elif isinstance(number, int) and not isinstance(number, bool):
                bound = 2**63 if isinstance(value, Lineage) and item.name == "at_unix_nano" else 2**31
                assert -bound <= number < bound, (item.name, number)

    def target(data: bytes) -> None:
        try:
            request = ExportLogsServiceRequest.FromString(data)
        except DecodeError:
            return
        records, refusals = decode_request(request)
        total = sum(len(s.log_records) for r in request.resource_logs for s in r.scope_logs)
        assert len(records) + len(refusals) == total
        for record in records:
            check(record)

    # Seeds from the hypothesis generators, and the wire vocabulary as a dictionary: libFuzzer alone
    # rarely spells a protobuf request, let alone an attribute name.
    corpus = Path(folder) / "corpus"
    corpus.mkdir()
    seeds = [run_completed("r-1"), snapshot_of("r-1", KNOWN_MEDIA_MESSAGE)]

    @settings(max_examples=200, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.one_of(steprec_records().map(lambda record: [record]), fragment_series()))
    def draw(records: list) -> None:
        seeds.extend(records)

    draw()
    for index, seed in enumerate(seeds):
        (corpus / f"seed-{index}").write_bytes(request_bytes(seed))
    words = Path(folder) / "wire.dict"
    names = {v for k, v in vars(wire).items() if k.isupper() and isinstance(v, str) and v.isprintable()}
    words.write_text("".join(f'"{name}"\n' for name in sorted(names) if '"' not in name and "\\" not in name))
    arguments = [f"-runs={runs}", "-max_len=8192", f"-dict={words}", f"-artifact_prefix={folder}/", str(corpus)]
    atheris.Setup([sys.argv[0], *arguments], target)
    atheris.Fuzz()


def _table(tallies: dict[str, Tally], cats: list[Category]) -> list[str]:
    lines = ["| category | inputs | seconds | what was generated | answers | record refusals |",
             "|---|---:|---:|---|---|---|"]  # fmt: skip
    for category in cats:
        tally = tallies[category.name]
        answers = ", ".join(f"{status} {count:,}" for status, count in tally.statuses.most_common())
        refused = ", ".join(f"`{code}` {count:,}" for code, count in tally.refusals.most_common()) or "-"
        if category.send is _records:
            refused = f"{tally.inputs - tally.refusals.total():,} taken (stored, or acknowledged as replays); {refused}"
        lines.append(
            f"| {category.name} | {tally.inputs:,} | {tally.seconds:,.0f} | {category.what} | {answers} | {refused} |"
        )
    return lines


def main(quick: bool) -> str:
    """Run every category against one recorder process and return the report's markdown section."""
    from tests.test_hostile_ingest import DEADLINE, is_serving
    from tests.test_hostile_queries import remove_scratch, scratch_untouched, seed

    started = time.monotonic()
    cats = categories(quick)
    with tempfile.TemporaryDirectory(prefix="steprec-fuzz-") as folder:
        target = Target(Path(folder))
        try:
            seed(target.channel)
            tallies = {}
            for category in cats:
                print(f"fuzz: {category.name} ({category.budget:,} inputs) ...", file=sys.stderr, flush=True)
                tallies[category.name] = run_category(target, category)
            sent = len(target.good.run_ids)
            stored = target.good.stored(target.recorder.endpoint)
            serving = target.recorder.process.poll() is None and is_serving(target.recorder.endpoint)
            peak = _peak_rss_mib(target.recorder.process.pid)
            untouched = scratch_untouched()
            log = target.recorder.log_path.read_text(errors="replace")
        finally:
            target.close()
            remove_scratch()
    atheris_line = _atheris(quick)
    seconds = time.monotonic() - started
    inputs = sum(t.inputs for t in tallies.values())
    problems, examples = Counter(), {}
    for name, tally in tallies.items():
        for key, count in tally.problems.items():
            problems[f"{name}: {key}"] += count
            examples[f"{name}: {key}"] = tally.examples[key]
    hangs = sum(t.statuses["HANG"] for t in tallies.values())
    lines = [
        "## Hostile input",
        "",
        f"{inputs:,} generated inputs against one recorder process (`steprec serve`, gRPC on 127.0.0.1), in"
        f" {seconds:,.0f} s. An input is one generated OTLP log record (each record hypothesis draws is followed"
        f" by up to {MUTANTS} mutants of it; a request holds up to a few hundred, a good record after every 8),"
        " one whole hostile Export payload, one part of a journal segment planted in a folder the recorder adopts"
        " (a frame, a tail, a flipped byte, a `.pos` text; each segment starts with a good record), or one query"
        " call. Generators and checks:"
        " tests/test_hostile_ingest.py and tests/test_hostile_queries.py (hypothesis), run at this size by"
        " `reliability/fuzz.py`. SQL that could build a huge value in one function call (which DuckDB neither"
        " interrupts nor counts against its memory limit) is refused before it runs (recorder/sql_sizes.py,"
        " docs/sql.md); tests/test_hostile_queries.py checks each such attack is refused within its time limit"
        " while the recorder's peak RSS stays put and other clients are served.",
        "",
        *_table(tallies, cats),
        "",
        "| invariant | result |",
        "|---|---:|",
        f"| daemon crashes (target 0) | {target.crashes} |",
        f"| hangs: no answer within {DEADLINE:g} s (target 0) | {hangs} |",
        f"| unclear or wrong answers: UNKNOWN/INTERNAL/UNAVAILABLE, a traceback, an answer other than the right"
        f" one (target 0) | {sum(problems.values()):,} |",
        f"| good records acknowledged / read back | {sent:,} / {stored:,} |",
        f"| files hostile SQL created, or secret content it returned | {'none' if untouched else 'FOUND'} |",
        f"| recorder alive and SERVING at the end | {'yes' if serving else 'NO'} |",
        f"| recorder peak RSS | {peak:,.0f} MiB |" if peak else "| recorder peak RSS | unknown |",
        f"| tracebacks in the recorder's log | {log.count('Traceback')} |",
        f"| atheris on `decode_request` (in-process, coverage-guided) | {atheris_line} |",
        "",
    ]
    if problems:
        lines += ["Unclear or wrong answers, by kind:", ""]
        lines += [f"- {count:,} × {key}  \n  first: `{examples[key]}`" for key, count in problems.most_common(12)]
        lines.append("")
    if "Traceback" in log:  # the recorder's own account of its first failure, for whoever fixes it
        first = log[log.index("Traceback") :].splitlines()[:40]
        lines += ["The recorder's log, from its first traceback:", "", "```text", *first, "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--atheris"]:
        _atheris_child(int(sys.argv[2]), sys.argv[3])
    else:
        print(main(quick="--quick" in sys.argv[1:]))
