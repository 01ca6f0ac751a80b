"""How long the recorder's allocators keep memory it freed before giving it back to the operating system.

pyarrow's allocator (mimalloc) gives freed pages back after 10 ms and DuckDB's (jemalloc) after 1 s, so a
large read that follows a pause finds none of the memory the last one used and faults every page in again:
a 100,000-run tree read 2.5 s after the previous one took about 5,000 page faults and 14 ms more than one
right after it (measured; docs/benchmarks.md). Ten seconds instead keeps the reads of one session warm, and a
recorder left idle still gives its peak back. Not longer: a busy recorder's DuckDB frees memory all the time,
and what jemalloc keeps grows with the time it keeps it. At a minute, the soak of docs/reliability.md held up
to 140 MiB of freed DuckDB pages (jemalloc's resident less its active bytes), a quarter of its RSS. Pages past
that time are given back at once (`muzzy_decay_ms:0`): "muzzy" pages would still count in RSS.

Both allocators read these settings from the environment once, when their library loads, which is before any
command runs: `RecorderProcess` starts the daemon with them, and `steprec serve` started without them starts
over with them (`restart_with_settings`). A value the operator set is kept.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable

RETAIN_MS = 10_000
SETTINGS = {
    "MIMALLOC_PURGE_DELAY": str(RETAIN_MS),
    "DUCKDB_JE_MALLOC_CONF": f"dirty_decay_ms:{RETAIN_MS},muzzy_decay_ms:0",
}


def missing() -> dict[str, str]:
    """The settings this process's environment does not name yet."""
    return {name: value for name, value in SETTINGS.items() if name not in os.environ}


def restart_with_settings() -> None:
    """Replace this process by the same command with the missing settings, when it is `... serve` run from a
    command line (not a `main([...])` inside another program) on a POSIX system; else return and serve as is.

    The process keeps its id, so a supervisor (systemd, Docker's PID 1) sees the same daemon.
    """
    settings = missing()
    if not settings or sys.argv[1:2] != ["serve"] or os.name != "posix":
        return
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **settings})
    except OSError:  # the interpreter cannot be started again: serve with the allocators' own defaults
        return


def _glibc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library is another (musl, macOS)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def trim_periodically(stop: threading.Event, every: float = RETAIN_MS / 1000) -> threading.Thread | None:
    """Give the memory glibc's heaps hold free back to the operating system every `every` seconds, until
    `stop` is set; None where there is no glibc.

    Python's larger objects (message bodies, the run states' tables, gRPC's buffers) live in glibc's
    heaps, which return freed memory only from their top: in the 30-minute soak the heaps held up to
    89 MiB free while RSS kept rising. `malloc_trim` releases every free page inside them. It is the
    glibc counterpart of the other allocators' decay, at the same pace.
    """
    trim = _glibc_trim()
    if trim is None:
        return None

    def run() -> None:
        while not stop.wait(every):
            trim(0)

    thread = threading.Thread(target=run, name="steprec-malloc-trim", daemon=True)
    thread.start()
    return thread
