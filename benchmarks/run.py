"""The benchmark suite of steprec, side by side with pydantic-ai-harness: one command, one module per measurement.

    python3 benchmarks/run.py                  # every measurement, full size (under 20 minutes on 2 cores)
    python3 benchmarks/run.py --quick          # smaller sizes, fewer repeats (under 3 minutes)
    python3 benchmarks/run.py --only ingest    # one measurement (repeatable); the others' results are kept
    python3 benchmarks/run.py --report         # only regenerate docs/benchmarks.md from the saved results

Needs only Python 3.11+ and the package index. On first use (and whenever a
pyproject.toml of the repository changes) it creates `.venv-bench/` beside the
repository and installs the four steprec parts editable plus
pydantic-ai-harness==0.62.0 and matplotlib; pip resolves pydantic-ai-slim to the
version the harness pins, so constraints.txt is deliberately not used. It then
re-executes itself inside that venv.

Measurements (benchmarks/<name>.py, each `main(quick, workspace) -> Outcome`), run in this order
because reads takes over the long agent runs overhead wrote:
overhead (agent overhead and bytes on disk), ingest (synthetic), traffic (real agents' Exports replayed), reads,
faults (delivery while the recorder is
down and catching up). Each writes `benchmarks/results/<name>.md` and `<name>.json`; then
benchmarks/report.py regenerates docs/benchmarks.md and its plots under docs/img/ from every
saved result.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from dev import ensure_venv  # noqa: E402 - the one venv bootstrap, shared with the dev commands

VENV = ROOT / ".venv-bench"
PARTS = ["proto", "exporter", "query", "recorder"]
REQUIREMENTS = ["pydantic-ai-harness==0.62.0", "matplotlib==3.11.2"]
INPUTS = [ROOT / "pyproject.toml", *(ROOT / part / "pyproject.toml" for part in PARTS)]
MEASUREMENTS = ["overhead", "ingest", "traffic", "reads", "faults"]
STARTED = "STEPREC_BENCH_STARTED"


def ensure_environment() -> Path:
    """The bench venv's python, (re)installing when the inputs changed since the last install."""
    editable = [arg for part in PARTS for arg in ("-e", str(ROOT / part))]
    return ensure_venv(VENV, [*editable, *REQUIREMENTS], INPUTS)


def _inside_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    parser.add_argument("--only", action="append", choices=MEASUREMENTS, help="run only this measurement")
    parser.add_argument("--report", action="store_true", help="measure nothing; regenerate docs/benchmarks.md")
    args = parser.parse_args(argv)
    if not _inside_venv():
        os.environ[STARTED] = str(time.time())  # so the elapsed time printed at the end includes the setup
        python = ensure_environment()
        os.execv(python, [str(python), str(Path(__file__).resolve()), *argv])
    started = float(os.environ.get(STARTED, time.time()))
    sys.path.insert(0, str(ROOT))  # import the measurements as the `benchmarks` package
    from benchmarks import report
    from benchmarks.common import Workspace, machine

    chosen = [] if args.report else [name for name in MEASUREMENTS if not args.only or name in args.only]
    with tempfile.TemporaryDirectory(prefix="steprec-bench-") as folder:
        workspace = Workspace(Path(folder))
        for name in chosen:
            print(f"\n== {name} ==", flush=True)
            facts, measured = machine(), time.perf_counter()  # the load average as this measurement starts
            outcome = importlib.import_module(f"benchmarks.{name}").main(quick=args.quick, workspace=workspace)
            written = report.save(name, outcome, facts, args, time.perf_counter() - measured)
            print(f"({name}: {(time.perf_counter() - measured) / 60:.1f} min; written to {written})", flush=True)
    print(f"\n(regenerated {report.write_docs()})", flush=True)
    elapsed = time.time() - started
    print(f"elapsed: {elapsed:,.0f} s ({elapsed / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
