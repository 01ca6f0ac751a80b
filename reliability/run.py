"""The reliability suite's long run (issue 6): faults, hostile input, a full disk, a slow recorder and a
soak, each against real processes on 127.0.0.1, written up as docs/reliability.md.

    python3 reliability/run.py            # every scenario at report size (about half an hour)
    python3 reliability/run.py --quick    # the fast sizes the normal test suite also uses
    python3 reliability/run.py --only fuzz --only disk

Needs only Python 3.11+ and the package index: it uses the development venv (`.venv`, made by
scripts/dev.py) and re-executes itself there. Each scenario module's `main(quick)` returns its
markdown section; the sections go to `reliability/results/<name>.md`, and docs/reliability.md is
rebuilt from all of them, so the page always states the newest figures of every scenario.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from dev import VENV, ensure_environment  # noqa: E402 - the one venv bootstrap, shared with the dev commands

SCENARIOS = ["faults", "disk", "fuzz", "load", "soak"]  # each is reliability/<name>.py with `main(quick: bool) -> str`
RESULTS = ROOT / "reliability" / "results"
REPORT = ROOT / "docs" / "reliability.md"
INTRO = """# Reliability

What steprec keeps when things go wrong, measured: agents and recorders killed with SIGKILL at every
boundary, a recorder down or slow, a journal overflowing, a full disk, hostile input from strangers,
and a soak of several agents and a load generator together. Every scenario runs real processes on
127.0.0.1, nothing mocked, and cleans up after itself. The targets: no acknowledged record lost,
none stored twice, no daemon crash or hang on any input.

Reproduce every figure on this page with one command (about an hour on 2 cores, half of it the soak; the normal
test suite runs a fast version of each scenario, `--quick` runs those sizes here):

```bash
python3 reliability/run.py
```

Each section below is rebuilt by the run that last included it; its header line says when.
"""


def _inside_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def _machine() -> str:
    """The machine and the code a run measures: taken when the run starts, since commits may land during it."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()},"
        f" commit {commit.stdout.strip() or 'unknown'}{' with uncommitted changes' if changed else ''}"
    )


def write_report() -> None:
    """docs/reliability.md: the introduction, then the newest section of each scenario that has one."""
    sections = [(RESULTS / f"{name}.md") for name in SCENARIOS]
    body = "\n".join(path.read_text() for path in sections if path.exists())
    REPORT.write_text(INTRO + "\n" + body)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the fast sizes of the normal test suite")
    parser.add_argument("--only", action="append", choices=SCENARIOS, help="run only this scenario (repeatable)")
    args = parser.parse_args(argv)
    if not _inside_venv():
        python = ensure_environment()
        os.execv(python, [str(python), str(Path(__file__).resolve()), *argv])
    sys.path.insert(0, str(ROOT))  # the scenarios import `reliability` and the test agents in `tests`
    os.chdir(ROOT)  # agent processes are started as `python -m tests...`
    RESULTS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="steprec-reliability-journal-") as journal:
        os.environ["STEPREC_JOURNAL_DIR"] = journal  # never the user's own journal
        for name in args.only or SCENARIOS:
            started, machine = time.monotonic(), _machine()
            print(f"reliability: {name} ...", flush=True)
            section = importlib.import_module(f"reliability.{name}").main(quick=args.quick)
            stamp = (
                f"_{'Quick' if args.quick else 'Full'} run of {datetime.now(UTC):%Y-%m-%d %H:%M} UTC,"
                f" {time.monotonic() - started:,.0f} s, on {machine}._\n\n"
            )
            title, _, rest = section.partition("\n")
            (RESULTS / f"{name}.md").write_text(f"{title}\n\n{stamp}{rest.lstrip()}")
            write_report()
    print(f"written to {REPORT.relative_to(ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
