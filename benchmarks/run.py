"""Benchmarks of steprec, side by side with pydantic-ai-harness: one entry point, one module per measurement.

    python3 benchmarks/run.py                  # every measurement, full size
    python3 benchmarks/run.py --quick          # smaller N, fewer repeats: a smoke run of a few minutes
    python3 benchmarks/run.py --only overhead  # one measurement (repeatable)

Needs only Python 3.11+ and the package index. On first use (and whenever a
pyproject.toml of the repository changes) it creates `.venv-bench/` beside the
repository and installs the four steprec parts editable plus
pydantic-ai-harness==0.62.0; pip resolves pydantic-ai-slim to the version the
harness pins, so constraints.txt is deliberately not used. It then re-executes
itself inside that venv. Each measurement prints its table and writes it to
`benchmarks/results/<name>.md`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from dev import ensure_venv  # noqa: E402 - the one venv bootstrap, shared with the dev commands

VENV = ROOT / ".venv-bench"
PARTS = ["proto", "exporter", "query", "recorder"]
REQUIREMENTS = ["pydantic-ai-harness==0.62.0"]
INPUTS = [ROOT / "pyproject.toml", *(ROOT / part / "pyproject.toml" for part in PARTS)]
MEASUREMENTS = ["overhead", "ingest", "reads"]  # each is benchmarks/<name>.py with `main(quick: bool) -> str`


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
    args = parser.parse_args(argv)
    if not _inside_venv():
        python = ensure_environment()
        os.execv(python, [str(python), str(Path(__file__).resolve()), *argv])
    sys.path.insert(0, str(ROOT))  # import the measurements as the `benchmarks` package
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    for name in args.only or MEASUREMENTS:
        report = importlib.import_module(f"benchmarks.{name}").main(quick=args.quick)
        (results / f"{name}.md").write_text(report)
        print(f"\n(written to {(results / f'{name}.md').relative_to(ROOT)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
