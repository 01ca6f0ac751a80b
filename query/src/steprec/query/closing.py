"""The context-manager shape the client and the stores share: `async with x:` closes `x` on the way out."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class AsyncClosing:
    """`__aenter__` returns the object, `__aexit__` awaits its `close()`."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
