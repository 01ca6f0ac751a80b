"""The PNG plots of docs/benchmarks.md, drawn from the saved figures of each measurement (matplotlib, no display)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot  # noqa: E402 - the backend is chosen first
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

STYLE = {"figure.figsize": (7.5, 4.2), "figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3, "font.size": 9}
STORE_LABELS = {
    "harness-sqlite": "harness SqliteStepStore",
    "harness-file": "harness FileStepStore",
    "steprec": "steprec recorder (data folder)",
    "steprec-database": "steprec DuckDB file + media",
}
INGEST_TARGET = 40_000


def _log_axes(axes: Any, sizes: list[int], ylabel: str) -> None:
    """Log-log axes with the measured N as the x ticks and plain numbers on both axes."""
    axes.set(xscale="log", yscale="log", xlabel="steps per run (N)", ylabel=ylabel)
    axes.set_xticks(sizes, [str(n) for n in sizes])
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,g}"))


def _save(figure: Any, folder: Path, name: str) -> str:
    figure.tight_layout()
    figure.savefig(folder / name, metadata={"Software": None})
    pyplot.close(figure)
    return name


def time_per_step(data: dict[str, Any], folder: Path) -> str:
    """Median ms per step against N for each variant, with the min-max of the repeats as error bars."""
    figure, axes = pyplot.subplots()
    variants = list(dict.fromkeys(name for size in data["sizes"] for name in size["seconds"]))
    for name in variants:
        points = [(s["steps"], [t * 1000 / s["steps"] for t in s["seconds"][name]]) for s in data["sizes"]
                  if s["seconds"].get(name)]  # fmt: skip
        steps = [n for n, _ in points]
        medians = [statistics.median(v) for _, v in points]
        spread = [[m - min(v) for m, (_, v) in zip(medians, points, strict=True)],
                  [max(v) - m for m, (_, v) in zip(medians, points, strict=True)]]  # fmt: skip
        axes.errorbar(steps, medians, yerr=spread, marker="o", capsize=3, label=name)
    _log_axes(axes, [s["steps"] for s in data["sizes"]], "ms per step (median, min-max)")
    axes.set_title("Agent time per step, 2 KB tool returns")
    axes.legend(fontsize=8)
    return _save(figure, folder, "bench-time-per-step.png")


def bytes_on_disk(data: dict[str, Any], folder: Path) -> str:
    figure, axes = pyplot.subplots()
    for store, label in STORE_LABELS.items():
        points = [(s["steps"], s["bytes"][store] / 1e6) for s in data["sizes"] if store in s["bytes"]]
        axes.plot([n for n, _ in points], [b for _, b in points], marker="o", label=label)
    sizes = [s["steps"] for s in data["sizes"]]
    axes.plot(sizes, [s["message_bytes"] / 1e6 for s in data["sizes"]], "k--", label="distinct message bytes")
    _log_axes(axes, sizes, "MB on disk after one run")
    axes.set_title("Bytes on disk against N")
    axes.legend(fontsize=8)
    return _save(figure, folder, "bench-bytes.png")


def ingest_rate(data: dict[str, Any], folder: Path) -> str:
    figure, axes = pyplot.subplots()
    width = 0.38
    for offset, key in ((-width / 2, "acknowledged"), (width / 2, "applied")):
        for i, row in enumerate(data["rows"]):
            values = [run[key] for run in row["runs"]]
            median = statistics.median(values)
            spread = [[median - min(values)], [max(values) - median]]
            color = "tab:blue" if key == "acknowledged" else "tab:green"
            axes.bar(i + offset, median, width, yerr=spread, capsize=3, color=color, label=key if i == 0 else None)
    axes.axhline(INGEST_TARGET, color="tab:red", linestyle="--", label=f"target {INGEST_TARGET:,}/s")
    axes.set_xticks(range(len(data["rows"])), [f"{row['senders']} sender(s)" for row in data["rows"]])
    axes.set(ylabel="records/s (median, min-max)")
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    axes.set_title(f"Recorder ingest, {data['records_per_request']} step events per Export")
    axes.legend(fontsize=8)
    return _save(figure, folder, "bench-ingest.png")


def _rolling_median(values: list[float], window: int = 9) -> list[float]:
    half = window // 2
    return [statistics.median(values[max(0, i - half) : i + half + 1]) for i in range(len(values))]


def fault_steps(data: dict[str, Any], folder: Path) -> str:
    """Step time against step index in the first repeat: none, steprec with its recorder up, and the outage run."""
    repeat = data["repeats"][0]
    outage = repeat["outage"]
    figure, axes = pyplot.subplots()
    for name in ("none", "steprec", "outage"):
        stamps = repeat[name]["stamps"]
        durations = [(b - a) * 1000 for a, b in zip(stamps, stamps[1:], strict=False)]
        axes.plot(range(1, len(stamps)), _rolling_median(durations), label=name, linewidth=1.2)
    stamps = outage["stamps"]

    def step_at(moment: float | None) -> int:
        return len(stamps) if moment is None else sum(1 for s in stamps if s < moment)

    up, drained = step_at(outage["up_at"]), step_at(outage["drained_at"])
    axes.axvspan(0, up, color="tab:red", alpha=0.12, label="recorder down (journaling)")
    axes.axvspan(up, drained, color="tab:orange", alpha=0.15, label="catching up (journal re-sent)")
    axes.set(xlabel="step", ylabel="ms per step (rolling median of 9)")
    axes.set_title("Step time while the recorder is down and catching up (first repeat)")
    axes.legend(fontsize=8)
    return _save(figure, folder, "bench-faults.png")


PLOTS: dict[str, tuple[str, Callable[[dict[str, Any], Path], str], str]] = {
    "plot_time_per_step": ("overhead", time_per_step, "agent time per step against N, per variant"),
    "plot_bytes": ("overhead", bytes_on_disk, "bytes on disk after one run against N, per store"),
    "plot_ingest": ("ingest", ingest_rate, "recorder ingest rate, 1 and 4 senders"),
    "plot_faults": ("faults", fault_steps, "step time of the outage run beside none and steprec"),
}


def draw(data: dict[str, dict[str, Any]], folder: Path) -> dict[str, tuple[str, str]]:
    """Every plot whose measurement has data, into `folder`; placeholder name -> (file name, alt text)."""
    folder.mkdir(parents=True, exist_ok=True)
    with pyplot.rc_context(STYLE):
        return {key: (plot(data[name], folder), alt) for key, (name, plot, alt) in PLOTS.items() if name in data}
