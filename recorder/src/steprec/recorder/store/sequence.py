"""`write_seq`: the order rows were written in, unique within a store.

A file has one writer, so a counter does. Recorders sharing a lake write at once: each takes the current time
in microseconds (never less than its last value plus one) with its fleet slot in the low bits, so values are
unique across the fleet and a run that moves from one recorder to another keeps its rows in write order as far
as the hosts' clocks agree (NTP keeps them within milliseconds; a run moves only after a reconnect).
"""

from __future__ import annotations

import time

SLOT_BITS = 10


class Counter:
    def __init__(self, first: int) -> None:
        self._next = first

    def __call__(self) -> int:
        self._next += 1
        return self._next - 1


class FleetClock:
    def __init__(self, slot: int) -> None:
        if not 0 <= slot < 1 << SLOT_BITS:
            raise ValueError(f"slot {slot} is outside 0..{(1 << SLOT_BITS) - 1}")
        self._slot = slot
        self._last = 0

    def __call__(self) -> int:
        self._last = max(time.time_ns() // 1000, self._last + 1)
        return self._last << SLOT_BITS | self._slot

    def advance_past(self, value: int) -> None:
        """Never give `value` or less again: another recorder wrote it, on a clock maybe ahead of this one."""
        self._last = max(self._last, value >> SLOT_BITS)
