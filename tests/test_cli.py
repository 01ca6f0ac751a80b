"""The `steprec` read commands against a real recorder: output for people and scripts, and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pydantic_ai.messages import ModelMessagesTypeAdapter
from steprec.query import RecorderClient
from steprec.recorder.daemon.process import RecorderProcess

from .agents import echo_agent

STEPREC = str(Path(sys.executable).parent / "steprec")


def _steprec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STEPREC, *args], capture_output=True, text=True, timeout=60)


async def test_read_commands(recorder: RecorderProcess, client: RecorderClient) -> None:
    result = await echo_agent(recorder.endpoint, calls=2).run("go", conversation_id="conv-cli")
    run_id, endpoint = result.run_id, ("--endpoint", recorder.endpoint)

    runs = json.loads(_steprec("runs", "--conversation", "conv-cli", "--json", *endpoint).stdout)
    assert [r["run_id"] for r in runs] == [run_id] and runs[0]["outcome"] == "completed"
    table = _steprec("runs", "--conversation", "conv-cli", *endpoint)
    assert table.returncode == 0 and run_id[:8] in table.stdout and "completed" in table.stdout

    tree = _steprec("tree", run_id, *endpoint)
    assert tree.returncode == 0 and "echoer" in tree.stdout
    events = json.loads(_steprec("events", run_id, "--json", *endpoint).stdout)
    assert events[0]["kind"] == "run_started" and events[-1]["kind"] == "run_completed"
    effects = _steprec("effects", run_id, "--unresolved", "--json", *endpoint)
    assert effects.returncode == 0 and json.loads(effects.stdout) == []

    snapshot = json.loads(_steprec("snapshot", run_id, "--at", "0", "--json", *endpoint).stdout)
    assert snapshot["snapshot_index"] == 0 and len(snapshot["messages"]) == 3
    continued = _steprec("continue", run_id, *endpoint)
    history = ModelMessagesTypeAdapter.validate_json(continued.stdout)
    assert len(history) == len(result.all_messages())
    forked = ModelMessagesTypeAdapter.validate_json(_steprec("fork", run_id, "--at", "1", *endpoint).stdout)
    assert len(forked) == 5


def test_exit_codes_scripts_can_rely_on(recorder: RecorderProcess, tmp_path: Path) -> None:
    missing = _steprec("events", "never-recorded", "--endpoint", recorder.endpoint)
    assert missing.returncode == 3 and "never-recorded" in missing.stderr and "Traceback" not in missing.stderr
    unreachable = _steprec("runs", "--endpoint", "127.0.0.1:9")
    assert unreachable.returncode == 4 and "not reachable" in unreachable.stderr
    bad = _steprec("runs", "--outcome", "exploded", "--endpoint", recorder.endpoint)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    traversal = _steprec("tree", "../etc", "--endpoint", recorder.endpoint)
    assert traversal.returncode == 2 and "run_id" in traversal.stderr
