"""A full disk under a running recorder: writes are refused with a clear status, reads go on, and
everything comes back by itself when space returns (reliability/disk.py has the scenario)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reliability.disk import MountRefused, disk_full, small_disk


@pytest.fixture
def disk() -> Iterator[Path]:
    try:
        with small_disk() as folder:
            yield folder
    except MountRefused as refused:
        pytest.skip(str(refused))


async def test_a_full_disk_refuses_writes_serves_reads_and_recovers(disk: Path) -> None:
    result = await disk_full(disk, requests=20)
    assert result.refused >= 15, "once the disk is full, writes must be refused"
    for detail in result.refusal_details:
        assert detail.startswith("UNAVAILABLE: ") and "No space left on device" in detail and "retry" in detail
    assert result.reads_while_full == 2
    assert result.agent_seconds_while_full < 30 and result.agent_trail_complete
    assert result.records_stored == result.records_expected and result.duplicates == 0
    assert result.recorder_alive
