"""An agent process that picks up a recorded run: `python -m tests.resume_agent continue|fork ENDPOINT RUN [AT]`.

It reads the history from the recorder with `continue_run` or `fork_run(at=AT)`, runs a
real Agent on it with StepRecorder, and prints the new run's id and output as JSON.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from steprec.exporter import shutdown_pipelines
from steprec.query import RecorderClient, continue_run, fork_run

from .agents import echo_agent

ROOT = Path(__file__).resolve().parent.parent


def spawn(mode: str, endpoint: str, run_id: str, *at: int) -> dict:
    """Run this agent in a new Python process; its JSON report."""
    command = [sys.executable, "-m", "tests.resume_agent", mode, endpoint, run_id, *map(str, at)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


async def main(mode: str, endpoint: str, run_id: str, at: str | None = None) -> None:
    async with RecorderClient(endpoint) as client:
        if mode == "fork":
            history = await fork_run(client, run_id=run_id, at=int(at) if at is not None else None)
            metadata = history.metadata
        else:
            history, metadata = await continue_run(client, run_id=run_id), None
    # One more tool call than the history already answered, then a final answer.
    answered = sum(1 for m in history for p in getattr(m, "parts", []) if p.part_kind == "tool-return")
    result = await echo_agent(endpoint, calls=answered + 1).run(
        f"{mode} please", message_history=history, metadata=metadata
    )
    shutdown_pipelines()
    print(json.dumps({"run_id": result.run_id, "output": result.output, "history": len(history)}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
