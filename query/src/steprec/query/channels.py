"""One gRPC channel per event loop: a client that works wherever it was created.

A `grpc.aio` channel belongs to the event loop it was first used in. Users create clients where
the reference's examples create stores, at module level or before any loop exists, and then call
them inside `asyncio.run(main())`, perhaps several times: a channel made in `__init__` then fails
with "attached to a different loop" (or, with no loop at all, "There is no current event loop").
So a channel is made in the running loop when a call first needs it, one per loop, and a channel
whose loop has closed is let go (it cannot be awaited any more; gRPC closes it when it is dropped).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import grpc

Stubs = TypeVar("Stubs")


class LoopChannels(Generic[Stubs]):
    """The stubs of the running loop's channel, made by `stubs(channel)` on first use in that loop."""

    def __init__(self, connect: Callable[[], grpc.aio.Channel], stubs: Callable[[grpc.aio.Channel], Stubs]) -> None:
        self._connect = connect
        self._stubs = stubs
        self._lock = threading.Lock()  # loops of several threads may share one client
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[grpc.aio.Channel, Stubs]] = (
            weakref.WeakKeyDictionary()
        )

    def current(self) -> Stubs:
        """The running loop's stubs; raises RuntimeError outside a running loop, as any coroutine call would."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._by_loop.get(loop)
            if entry is None:
                self._let_go_of_closed_loops()
                channel = self._connect()
                entry = self._by_loop[loop] = (channel, self._stubs(channel))
        return entry[1]

    async def close(self) -> None:
        """Close the running loop's channel and let go of those whose loops have closed.

        A channel of a loop still running in another thread is left to that loop: closing it from here
        would cancel that thread's calls in flight (two threads sharing a client each close when done).
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._by_loop.pop(loop, None)
            self._let_go_of_closed_loops()
        if entry is not None:
            await entry[0].close()

    def _let_go_of_closed_loops(self) -> None:
        """Drop the channels of loops that have closed (held under the lock); gRPC closes them when dropped."""
        for gone in [other for other in self._by_loop if other.is_closed()]:
            del self._by_loop[gone]
