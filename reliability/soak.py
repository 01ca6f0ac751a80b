"""The soak: agent processes and a load generator against one recorder for 30 minutes, its memory watched.

`reliability/load.py` holds the scenario (`soak`) and its table (`soak_section`); this is its entry in
`reliability/run.py`. The recorder's memory budget is set small enough that every part fills within
the run, so the second half shows whether RSS levels off (issue 19: it must grow less than 5% over
the second half, and stay within the budget docs/storage.md states).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from reliability.load import QUICK_SOAK_SECONDS, SOAK_SECONDS, soak, soak_section


def main(quick: bool = False) -> str:
    seconds = QUICK_SOAK_SECONDS if quick else SOAK_SECONDS
    with tempfile.TemporaryDirectory() as folder:
        soaked = soak(Path(folder) / "soak", seconds=seconds)
    report = "\n".join(["## Soak", "", *soak_section(soaked)]) + "\n"
    print(report, flush=True)
    return report
