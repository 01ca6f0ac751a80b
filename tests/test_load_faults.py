"""A slow recorder and a short soak (issue 6, fast versions of `reliability/load.py`'s scenarios).

Real processes throughout: the recorder, each agent, the load generator. The
slow recorder sits behind `DelayingProxy`; the exporter's timeout is set to
half a second so that "slower than the timeout" fits in a test, and every
bound below is derived from that configured value, not from a guess.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability.load import (
    BARRIERS_PER_STEP,
    QUICK_SLOW,
    QUICK_SOAK_SECONDS,
    SlowRecorderResult,
    default_timeout_seconds,
    slow_recorder,
    soak,
)

TIMEOUT_SECONDS = QUICK_SLOW["timeout_seconds"]
SOAK_RSS_GROWTH_LIMIT_KIB = 200 << 10
"""Generous: a short soak cannot show a plateau (see the long run), but this catches a gross leak."""


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> SlowRecorderResult:
    return slow_recorder(tmp_path_factory.mktemp("slow"), **QUICK_SLOW)


def test_a_slow_recorder_adds_latency_bounded_by_the_timeout(slow: SlowRecorderResult) -> None:
    for phase in slow.phases:
        assert not phase.errors, phase
        if phase.name != "recovering":
            assert phase.within_bound, phase
    for delay in QUICK_SLOW["delays"]:
        (phase,) = (p for p in slow.phases if p.delay == delay)
        # The proxy really delayed every acknowledgement the agent waited for.
        assert phase.latency.p50 >= BARRIERS_PER_STEP * delay, phase
    journaling = slow.phase("journaling")
    assert journaling.delay > TIMEOUT_SECONDS and journaling.latency.p50 < TIMEOUT_SECONDS, journaling


def test_everything_sent_through_a_slow_recorder_is_stored_exactly_once(slow: SlowRecorderResult) -> None:
    assert slow.exit_code == 0
    assert slow.journal_left_bytes == 0
    assert slow.stored.distinct == slow.expected
    assert slow.stored.duplicates == 0
    assert slow.lost == 0


def test_an_agent_journaling_to_a_slow_recorder_does_not_grow_in_memory(slow: SlowRecorderResult) -> None:
    """What goes to the journal stays on disk: between the two readings the journal grows by far more than
    RSS may (generous: half of it, to absorb allocator noise on a loaded machine)."""
    first, last = slow.memory[0], slow.memory[-1]
    journaled_kib = (last.journaled.bytes - first.journaled.bytes) // 1024
    assert last.steps == 4 * first.steps
    assert journaled_kib > 16 << 10, slow.memory
    assert last.peak_rss_kib - first.peak_rss_kib < journaled_kib / 2, slow.memory


def test_catching_up_after_a_slow_spell_does_not_hold_the_agent_up(slow: SlowRecorderResult) -> None:
    """Once the recorder answers in time again, the journal drains while the agent runs, one hook at a time
    held by one re-send at most: not by (journaled requests) x (request time), as when the drain loop
    re-sent the whole journal before answering a waiting barrier."""
    recovering = slow.phase("recovering")
    assert slow.journaled_before_recovery.requests > 0
    assert slow.journaled_after_recovery.requests == 0, "the journal did not drain while the agent ran"
    assert recovering.within_bound, (recovering, slow.journaled_before_recovery)


def test_a_short_soak_stores_everything_once_and_holds_steady(tmp_path: Path) -> None:
    result = soak(tmp_path, seconds=QUICK_SOAK_SECONDS)
    assert not result.agent_errors
    assert not result.load.failures
    assert result.lost == 0 and result.duplicates == 0, (result.expected, result.stored, result.stored_distinct)
    assert result.stored_distinct == result.expected
    # Under load the recorder still answers well within the time an exporter waits before journaling.
    assert result.export_latency.p99 < default_timeout_seconds(), result.export_latency
    assert result.rss_window_max(first=False) - result.rss_window_max(first=True) < SOAK_RSS_GROWTH_LIMIT_KIB
