"""The report generator on canned results: every placeholder filled, targets listed, plots drawn (no benchmark runs).

The plots part needs matplotlib, which only .venv-bench has: in the dev venv it is reported skipped.
"""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.common import Outcome, Target

MACHINE = {
    "system": "Linux 6 x86_64",
    "cpu": "Test CPU",
    "cores": 2,
    "python": "3.11.7",
    "packages": {"duckdb": "1.5.5"},
    "commit": "abc1234",
    "dirty": False,
    "load_average": [0.1, 0.2, 0.3],
}


def _stamps(steps: int, ms: float, start: float = 100.0) -> list[float]:
    return [start + i * ms / 1000 for i in range(steps)]


CANNED = {
    "overhead": {
        "tool_return_chars": 2048,
        "sizes": [
            {
                "steps": steps,
                "seconds": {"none": [steps * 0.004] * 3, "steprec": [steps * 0.01, steps * 0.011, steps * 0.012]},
                "skipped": {"harness-file": "too slow"} if steps > 50 else {},
                "bytes": {"harness-sqlite": steps**2 * 240, "steprec": steps * 3500, "steprec-database": steps * 3400},
                "message_bytes": steps * 3390,
            }
            for steps in (50, 200, 1000)
        ],
    },
    "ingest": {
        "records_per_request": 512,
        "requests_per_sender": 40,
        "rows": [
            {"senders": s, "runs": [{"acknowledged": 50e3, "applied": 48e3, "p50_ms": 8.0, "p99_ms": 40.0}] * 2}
            for s in (1, 4)
        ],
    },
    "faults": {
        "steps": 60,
        "repeats": [
            {
                "none": {"stamps": _stamps(60, 4)},
                "steprec": {"stamps": _stamps(60, 9)},
                "outage": {"stamps": _stamps(60, 7), "up_at": 100.1, "drained_at": 100.3, "drained_after_run": False},
            }
        ],
    },
}


def _save_canned(results: Path) -> None:
    for name, data in CANNED.items():
        targets = [Target(3, f"{name} target", "1 ms", name != "ingest")]
        outcome = Outcome(data, targets, f"# {name}\n", {name: f"| {name} table |\n"})
        report.save(name, outcome, MACHINE, Namespace(quick=False, only=None), 60.0, results)


def test_every_placeholder_is_filled_and_every_target_listed(tmp_path: Path) -> None:
    _save_canned(tmp_path)
    records = report.load(tmp_path)
    assert set(records) == set(CANNED)  # reads was never saved: its sections say so
    assert json.loads((tmp_path / "overhead.json").read_text())["targets"][0]["met"] is True
    page = report.render(records, {"plot_ingest": ("bench-ingest.png", "ingest")}, report.TEMPLATE.read_text())
    assert "${" not in page and "$" not in page.replace("$$", "")
    assert "| overhead table |" in page and "| faults table |" in page
    assert "| 3 | ingest target | 1 ms | **not met** |" in page
    assert "Not measured yet: `python3 benchmarks/run.py --only reads`" in page
    assert "![ingest](img/bench-ingest.png)" in page
    assert "Test CPU, 2 cores" in page
    assert "Measured " in (tmp_path / "ingest.md").read_text()


def test_plots_are_drawn_from_canned_figures(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks import plots

    drawn = plots.draw(CANNED, tmp_path)
    assert set(drawn) == set(plots.PLOTS)
    for file, _ in drawn.values():
        assert (tmp_path / file).read_bytes().startswith(b"\x89PNG")
