"""SyncRecorderClient: RecorderClient for scripts and notebooks that are not async.

It runs one event loop on a private thread and hands every call to it, so it
also works where a loop is already running (Jupyter), where `asyncio.run`
would refuse.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

from pydantic_ai.messages import ModelMessage

from .client import RecorderClient
from .resume import ForkedHistory, continue_run, fork_run, inspect_recovery
from .types import RecoveryReport


async def _collect(items: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in items]


class SyncRecorderClient:
    """The same reads as `RecorderClient`, as plain method calls: `client.list_runs(...)`."""

    def __init__(self, endpoint: str | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="steprec-sync-client", daemon=True)
        self._thread.start()
        self._client: RecorderClient = self._run(self._open(endpoint, options))

    @staticmethod
    async def _open(endpoint: str | None, options: dict[str, Any]) -> RecorderClient:
        return RecorderClient(endpoint, **options)

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __getattr__(self, name: str):
        method = getattr(self._client, name)
        if inspect.isasyncgenfunction(method):  # iter_runs, iter_media, iter_view: all items as a list
            return lambda *args, **kwargs: self._run(_collect(method(*args, **kwargs)))
        if not asyncio.iscoroutinefunction(method):
            return method
        return lambda *args, **kwargs: self._run(method(*args, **kwargs))

    def continue_run(self, run_id: str, *, include_interrupted: bool = False) -> list[ModelMessage]:
        return self._run(continue_run(self._client, run_id=run_id, include_interrupted=include_interrupted))

    def fork_run(self, run_id: str, *, include_interrupted: bool = False, at: int | None = None) -> ForkedHistory:
        return self._run(fork_run(self._client, run_id=run_id, include_interrupted=include_interrupted, at=at))

    def inspect_recovery(self, run_id: str) -> RecoveryReport:
        return self._run(inspect_recovery(self._client, run_id=run_id))

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> SyncRecorderClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
