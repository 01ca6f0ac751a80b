"""Fixtures for RecorderStepStore against pydantic-ai-harness.

This folder needs pydantic-ai-harness, which pins its own pydantic-ai, so it runs in its own venv
(`python3 scripts/dev.py test-harness`); the main suite does not collect it. The recorder is a
real `steprec serve` process (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack

import pytest
from pydantic_ai_harness.step_persistence import InMemoryStepStore
from steprec.query import RecorderStepStore
from steprec.recorder.daemon.process import RecorderProcess

StorePair = tuple[RecorderStepStore, InMemoryStepStore]


@pytest.fixture
async def store(recorder: RecorderProcess) -> AsyncIterator[RecorderStepStore]:
    async with RecorderStepStore(recorder.endpoint) as recorder_store:
        yield recorder_store


@pytest.fixture
async def store_pair(recorder: RecorderProcess) -> AsyncIterator[Callable[..., StorePair]]:
    """`store_pair(max_snapshots_per_run=...)`: a RecorderStepStore and the harness's InMemoryStepStore,
    configured alike, to drive with the same calls and compare."""
    async with AsyncExitStack() as stack:

        def make(**options: object) -> StorePair:
            recorder_store = RecorderStepStore(recorder.endpoint, **options)
            stack.push_async_callback(recorder_store.close)
            return recorder_store, InMemoryStepStore(**options)

        yield make
