"""Shared fixtures: a real recorder process on a free loopback port, clients of it, and the browser's recorders."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from steprec.exporter import shutdown_pipelines
from steprec.query import RecorderClient
from steprec.recorder.daemon.process import RecorderProcess

from .ui_data import TOKEN, Recorded, record


@pytest.fixture(autouse=True)
def _private_journal(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test journals into its own folder, never the user's ~/.local/state; a recorder the test starts
    on loopback inherits the variable and so adopts that folder (its default), as it would the user's."""
    monkeypatch.setenv("STEPREC_JOURNAL_DIR", str(tmp_path_factory.mktemp("journal")))


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[RecorderProcess]:
    """`steprec serve` as a child process with its DuckDB file under tmp_path."""
    process = RecorderProcess(tmp_path / "recorder").start()
    try:
        yield process
    finally:
        shutdown_pipelines()
        process.stop()


@pytest.fixture
async def client(recorder: RecorderProcess) -> AsyncIterator[RecorderClient]:
    async with RecorderClient(recorder.endpoint) as query_client:
        yield query_client


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RecorderProcess, Recorded]]:
    """A recorder with its browser, holding the runs of tests/ui_data.py (one per module that asks)."""
    journal = tmp_path_factory.mktemp("journal")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STEPREC_JOURNAL_DIR", str(journal))
        process = RecorderProcess(tmp_path_factory.mktemp("ui") / "recorder").start()
        try:
            yield process, asyncio.run(record(process.endpoint))
        finally:
            shutdown_pipelines()
            process.stop()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecorderProcess]:
    """A recorder that requires `TOKEN`."""
    folder = tmp_path_factory.mktemp("guarded")
    token_file = folder / "token"
    token_file.write_text(TOKEN)
    with RecorderProcess(folder / "recorder", extra_args=("--token-file", str(token_file))) as process:
        yield process
