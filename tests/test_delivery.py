"""Delivery when the recorder is down, restarts, or comes back later: nothing hangs, nothing is lost."""

from __future__ import annotations

import logging
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from steprec.exporter import shutdown_pipelines
from steprec.exporter._journal import Journal
from steprec.query import RecorderClient
from steprec.recorder.daemon.process import RecorderProcess

from .agents import echo_agent

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _assert_complete_trail(endpoint: str, conversation_id: str, calls: int) -> None:
    async with RecorderClient(endpoint) as client:
        (run,) = await client.list_runs(conversation_id=conversation_id)
        kinds = [e.kind for e in await client.list_events(run.run_id)]
        assert kinds[0] == "run_started" and kinds[-1] == "run_completed"
        assert kinds.count("tool_call_completed") == calls
        assert len(kinds) == len(set(e.idempotency_key for e in await client.list_events(run.run_id)))
        snapshot = await client.latest_snapshot(run.run_id)
        assert snapshot is not None and len(snapshot.messages) == 2 + 2 * calls


async def test_a_run_with_the_recorder_down_finishes_and_is_delivered_later(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{_free_port()}"
    agent = echo_agent(endpoint, calls=3, journal_dir=tmp_path / "journal")
    started = time.monotonic()
    result = await agent.run("go", conversation_id="conv-down")
    assert result.output == "saw 3 returns"
    assert time.monotonic() - started < 5, "a recorder that is down must not hold the agent up"
    assert list((tmp_path / "journal").glob("journal-*.log"))

    with RecorderProcess(tmp_path / "recorder", listen=endpoint):
        shutdown_pipelines()  # flushes: the journal drains into the recorder that is now up
        assert not list((tmp_path / "journal").glob("journal-*.log"))
        await _assert_complete_trail(endpoint, "conv-down", calls=3)


async def test_shutdown_with_the_recorder_down_ends_the_delivery_thread_and_keeps_the_journal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After shutdown a failing recorder is not retried into a closed journal: the thread ends, and the
    segment stays for the recorder, a later process or `steprec journal push` to adopt."""
    endpoint = f"127.0.0.1:{_free_port()}"
    agent = echo_agent(endpoint, calls=1, journal_dir=tmp_path / "journal")
    await agent.run("go", conversation_id="conv-closed")
    with caplog.at_level(logging.WARNING):
        started = time.monotonic()
        shutdown_pipelines()
        assert time.monotonic() - started < 4, "shutdown waited out the delivery thread's join timeout"
        time.sleep(0.3)
    assert not [t for t in threading.enumerate() if t.name == "steprec-delivery"]
    assert "delivery failed unexpectedly" not in caplog.text
    assert list((tmp_path / "journal").glob("journal-*.log"))


async def test_a_later_process_delivers_what_a_killed_one_journaled(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{_free_port()}"
    journal = tmp_path / "journal"
    child = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.agents import echo_agent
        agent = echo_agent({endpoint!r}, calls=2, journal_dir={str(journal)!r})
        asyncio.run(agent.run("go", conversation_id="conv-orphan"))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert list(journal.glob("journal-*.log"))

    with RecorderProcess(tmp_path / "recorder", listen=endpoint):
        # Any recorded run of a new process on the same journal adopts and drains the orphan.
        await echo_agent(endpoint, calls=1, journal_dir=journal).run("hello", conversation_id="conv-new")
        shutdown_pipelines()
        await _assert_complete_trail(endpoint, "conv-orphan", calls=2)
        await _assert_complete_trail(endpoint, "conv-new", calls=1)


def test_a_long_journal_drains_in_order_reading_each_request_once(tmp_path: Path) -> None:
    """Re-reading a segment from its start for every request made draining 4,000 of them take about
    a minute (quadratic in the journal's length); read once, they take well under a second. Requests
    come back in order, many at a time, and a drained segment is removed when the journal closes."""
    journal = Journal(tmp_path, max_bytes=1 << 30)
    requests = [f"request {i:05}|".encode() * 180 for i in range(4000)]
    assert all(journal.append(request) for request in requests)
    started, delivered, peeks = time.monotonic(), [], 0
    while (head := journal.peek(256 << 10)) is not None:
        end, batch, own = head
        assert own
        delivered += batch
        peeks += 1
        journal.acknowledge(end)
    assert delivered == requests
    assert peeks < len(requests) / 50, "up to 256 KiB of requests go in one re-send"
    assert time.monotonic() - started < 10
    journal.close()
    assert not list(tmp_path.glob("journal-*"))


def test_a_failed_journal_write_is_dropped_loudly_and_cut_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A full disk fails a write part-way (here the file-size limit, RLIMIT_FSIZE, a real EFBIG from the
    kernel). The request is dropped, counted and warned about instead of escaping the delivery thread
    (where it left every later barrier waiting forever), and the partial frame is cut off, so what
    was journaled before and after reads back whole."""
    journal = Journal(tmp_path, max_bytes=1 << 30)
    assert journal.append(b"a" * 1000)
    limit, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limit[1]))
        with caplog.at_level(logging.WARNING, logger="steprec.exporter._journal"):
            assert not journal.append(b"b" * 10_000)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert journal.dropped == 1 and "cannot take it" in caplog.text
    assert journal.append(b"c" * 1000)
    assert journal.peek(1 << 20)[1] == [b"a" * 1000, b"c" * 1000]


async def test_interpreter_exit_delivers_what_is_pending(recorder: RecorderProcess, client: RecorderClient) -> None:
    # best_effort waits for nothing, so at exit the tail of the run is still in memory.
    child = textwrap.dedent(
        f"""
        import asyncio, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.agents import echo_agent
        agent = echo_agent({recorder.endpoint!r}, calls=5, delivery="best_effort")
        asyncio.run(agent.run("go", conversation_id="conv-exit"))
        """
    )
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    await _assert_complete_trail(recorder.endpoint, "conv-exit", calls=5)
