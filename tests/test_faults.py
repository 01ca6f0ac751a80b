"""The fault matrix at its fast size: real processes, real SIGKILLs (the scenarios are reliability/faults.py;
`reliability/run.py` runs them at report size)."""

from __future__ import annotations

from reliability import faults

from .crash_agent import KILL_POINTS


async def test_an_agent_killed_at_every_boundary_leaves_what_was_promised_and_resumes() -> None:
    result = await faults.agent_kills(rounds=1)
    assert result.problems == []
    assert result.faults == len(KILL_POINTS)
    assert result.expected == result.stored > 0 and result.lost == result.duplicates == 0


async def test_a_recorder_killed_again_and_again_stores_every_record_once() -> None:
    result = await faults.recorder_kills(kills=3, agents=3, every=(0.5, 1.0))
    assert result.problems == []
    assert result.faults == 3 and result.notes["steps"] > 3 * 5
    assert result.expected == result.stored > 0 and result.lost == result.duplicates == 0


async def test_a_recorder_down_for_a_while_loses_nothing() -> None:
    result = await faults.recorder_outage(seconds=3.0, agents=3)
    assert result.problems == []
    assert result.notes["peak_journal_kib"] > 0, "the agents must have recorded into the journal while it was down"
    # No step waits for more than one Export (timeout_seconds, 5 s) and one journal re-send after it:
    # catching up after the outage must not hold an agent up for the whole journal.
    assert result.notes["longest_step_s"] < 10, result.notes
    assert result.expected == result.stored > 0 and result.lost == result.duplicates == 0


async def test_a_full_journal_drops_exactly_the_requests_that_do_not_fit() -> None:
    result = await faults.journal_overflow(calls=10)
    assert result.problems == []
    # Returns of 0.4 MiB into 1 MiB: the first cycle's request fits; the second's (a delta of two returns)
    # does not, and neither does any after it (whole snapshots, since their base was dropped), the answer's
    # and its second try at the run's end too.
    assert result.notes["expected_drops"] == 11
    assert result.faults == result.notes["requests_dropped"] == result.notes["warnings"] == 11
    assert result.lost == result.duplicates == 0
