"""The main job: `steprec demo` on a machine with nothing running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb


def test_demo_runs_end_to_end_and_keeps_its_data(tmp_path: Path) -> None:
    steprec = Path(sys.executable).parent / "steprec"
    result = subprocess.run(
        [str(steprec), "demo", "--data", str(tmp_path)], capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "└── librarian" in out  # the delegate hangs under the planner in the tree
    assert "(fork of its snapshot" in out  # and the fork under the run it came from
    assert "booker failed as planned" in out and "[failed]" in out
    assert "continue_run(" in out and "fork_run(" in out
    assert "recorder stopped cleanly" in out
    with duckdb.connect(str(tmp_path / "steprec.duckdb"), read_only=True) as db:
        assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 5
        tools = db.execute("SELECT count(DISTINCT tool_call_id) FROM tool_effects").fetchone()[0]
        assert tools >= 5
