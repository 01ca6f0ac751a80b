"""HistoryCache's copies: made ahead (`spare`) for the messages they copy, lent again once nobody holds them."""

from __future__ import annotations

import hashlib
import weakref

from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelRequest, ModelResponse, TextPart, UserPromptPart
from steprec.query.history_cache import READS_REMEMBERED, HistoryCache

BODIES = {
    hashlib.sha256(body).digest(): body
    for body in (
        ModelMessagesTypeAdapter.dump_json([message])[1:-1]
        for message in [ModelRequest(parts=[UserPromptPart(f"ask {n}")]) for n in range(3)]
        + [ModelResponse(parts=[TextPart(f"answer {n}")]) for n in range(3)]
    )
}
D = list(BODIES)  # six digests


async def fetch(digests: list[bytes]) -> list[bytes]:
    return [BODIES[digest] for digest in digests]


def _json(messages) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


async def test_copies_made_ahead_serve_the_same_history_and_the_start_of_a_longer_one() -> None:
    cache, read = HistoryCache(), ("run-1", False, None)
    first_digests, longer_digests = b"".join(D[:3]), b"".join(D)
    assert cache.spare(read) is None  # nothing handed out yet
    first = await cache.history(first_digests, fetch, read=read)

    spare = cache.spare(read)
    assert spare is not None and spare.digests == first_digests
    again = await cache.history(first_digests, fetch, read=read, spare=spare)
    assert all(a is b for a, b in zip(again, spare.copies, strict=True))  # the spare copies are what it hands out
    assert all(a is not b for a, b in zip(again, first, strict=True)) and _json(again) == _json(first)

    # Changing a history handed out does not reach the copies made for the next read.
    again[0].run_id = "edited"
    spare = cache.spare(read)
    longer = await cache.history(longer_digests, fetch, read=read, spare=spare)
    assert [m is c for m, c in zip(longer, spare.copies + [None] * 3, strict=True)] == [True] * 3 + [False] * 3
    assert longer[0].run_id is None and len(longer) == 6

    # A spare of a history the answer does not begin with is not used.
    spare = cache.spare(read)
    other = await cache.history(b"".join(D[3:]), fetch, read=read, spare=spare)
    assert not {id(m) for m in other} & {id(c) for c in spare.copies}


async def test_only_the_latest_reads_are_remembered() -> None:
    cache = HistoryCache()
    for n in range(READS_REMEMBERED + 1):
        await cache.history(D[0], fetch, read=("run", False, n))
    assert cache.spare(("run", False, 0)) is None
    assert cache.spare(("run", False, READS_REMEMBERED)) is not None


async def test_a_client_without_a_message_cache_makes_no_copies_ahead() -> None:
    cache, read = HistoryCache(max_bytes=0), ("run-1", False, None)
    await cache.history(b"".join(D), fetch, read=read)
    assert cache.spare(read) is None


async def test_copies_nobody_holds_are_lent_again_and_held_or_changed_ones_are_not() -> None:
    cache, digests, read = HistoryCache(), b"".join(D), ("run-1", False, None)
    first = await cache.history(digests, fetch, read=read)
    recorded, dropped = _json(first), [weakref.ref(m) for m in first]
    del first
    again = await cache.history(digests, fetch, read=read)
    assert all(ref() is m for ref, m in zip(dropped, again, strict=True))  # nothing else held them: lent again

    held = await cache.history(digests, fetch, read=read, spare=cache.spare(read))
    assert not {id(m) for m in held} & {id(m) for m in again} and _json(held) == recorded
    del again

    # The copies lent last (`held`) changed, then dropped: the changed ones are replaced, the rest lent again.
    held[0].run_id, held[1].parts, held[2].extra = "edited", [TextPart("changed")], True
    dropped = [weakref.ref(m) for m in held]
    del held
    spare = cache.spare(read)
    assert spare is not None
    assert [ref() is m for ref, m in zip(dropped, spare.copies, strict=True)] == [False] * 3 + [True] * 3
    latest = await cache.history(digests, fetch, read=read, spare=spare)
    assert _json(latest) == recorded and not hasattr(latest[2], "extra")


async def test_reads_in_flight_together_never_share_a_copy() -> None:
    cache, digests, read = HistoryCache(), b"".join(D), ("run-1", False, None)
    await cache.history(digests, fetch, read=read)  # dropped at once: its copies are free to lend again
    first_spare, second_spare = cache.spare(read), cache.spare(read)  # two reads begun before either is answered
    first = await cache.history(digests, fetch, read=read, spare=first_spare)
    second = await cache.history(digests, fetch, read=read, spare=second_spare)
    assert not {id(m) for m in first} & {id(m) for m in second} and _json(first) == _json(second)
