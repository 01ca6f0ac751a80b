"""The run browser's pages on the reads measurement's data (issue 21): the time the recorder's app takes for
each, from its `Server-Timing` header, and the time until the whole page arrived over loopback.

Called by benchmarks/reads.py while its recorder holds the 100,000 runs and the 1000-step run, so the pages
read the same data the reads did. Each page is fetched `repeats` times after a warm-up, the pages interleaved.
"""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any

from benchmarks.common import Target, percentile

PAGES_MS = {"runs": 100.0, "tree": 100.0, "tree_level": 100.0, "run": 300.0}
"""Issue 21's targets, server time p50: the runs page and the tree's first level; the long run's page."""
_SERVER = re.compile(r"app;dur=([0-9.]+)")
WARMUP = 3


def _fetch(url: str) -> tuple[float, float, int]:
    """(server seconds, wall seconds, bytes) of one GET that must answer 200."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as answer:
        body = answer.read()
        server = float(_SERVER.search(answer.headers["server-timing"])[1]) / 1000
    return server, time.perf_counter() - started, len(body)


def measure(ui_url: str, *, root: str, long_run: str, repeats: int) -> dict[str, Any]:
    base = ui_url.rstrip("/")
    pages = {
        "runs": f"{base}/",
        "tree": f"{base}/runs/{root}/tree",
        "tree_level": f"{base}/api/runs/{root}/below",
        "run": f"{base}/runs/{long_run}",
    }
    for url in pages.values():
        for _ in range(WARMUP):
            _fetch(url)
    found: dict[str, dict[str, list[float]]] = {name: {"server": [], "wall": [], "bytes": []} for name in pages}
    for n in range(repeats):
        for name in pages if n % 2 == 0 else reversed(pages):
            server, wall, size = _fetch(pages[name])
            found[name]["server"].append(server)
            found[name]["wall"].append(wall)
            found[name]["bytes"].append(size)
    return found


LABELS = {
    "runs": "runs page (`/`, the newest 50)",
    "tree": "tree page of the root (`/runs/<root>/tree`, its first level)",
    "tree_level": "the root's first level as JSON (`/api/runs/<root>/below`)",
    "run": "run page of the long run (`/runs/<run>`: events, ledger, the last 50 messages)",
}


def table(found: dict[str, Any]) -> str:
    lines = [
        "| page | server p50 / p99 ms | whole page p50 ms | bytes | target (server p50) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, label in LABELS.items():
        series = found[name]
        server = f"{percentile(series['server'], 0.5) * 1000:,.1f} / {percentile(series['server'], 0.99) * 1000:,.1f}"
        lines.append(
            f"| {label} | {server} | {percentile(series['wall'], 0.5) * 1000:,.1f}"
            f" | {int(percentile(series['bytes'], 0.5)):,} | {PAGES_MS[name]:,.0f} ms |"
        )
    return "\n".join(lines) + "\n"


def targets(found: dict[str, Any], *, stated: bool, scale: str) -> list[Target]:
    rows = {
        "runs": "the runs page answers in at most 100 ms server time p50",
        "tree_level": "the tree's first level answers in at most 100 ms server time p50",
        "run": "the run page of the 1000-step run (messages paged) in at most 300 ms server time p50",
    }
    out = []
    for name, text in rows.items():
        p50 = percentile(found[name]["server"], 0.5) * 1000
        out.append(Target(21, text + " (on 100,000 runs)", f"p50 {p50:,.1f} ms{scale}",
                          p50 <= PAGES_MS[name] if stated else None))  # fmt: skip
    return out
