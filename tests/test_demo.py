"""The main job: `steprec demo` on a machine with nothing running."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.request
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


def test_demo_serve_leaves_the_browser_up_on_its_data_until_interrupted(tmp_path: Path) -> None:
    steprec = Path(sys.executable).parent / "steprec"
    demo = subprocess.Popen([str(steprec), "demo", "--serve", "--data", str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert demo.stdout is not None
        url = None
        for line in demo.stdout:
            if match := re.search(r"browse the demo's runs at (http://\S+)", line):
                url = match[1]
                break
        assert url, demo.stderr.read() if demo.stderr else ""
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200 and "planner" in page.read().decode()
        demo.send_signal(signal.SIGINT)
        assert demo.wait(60) == 0
        assert "recorder stopped cleanly" in demo.stdout.read()
    finally:
        if demo.poll() is None:
            demo.kill()
