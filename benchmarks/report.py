"""docs/benchmarks.md from the saved results: benchmarks/template.md with each measurement's tables and plots.

Each measurement's last result is kept as `benchmarks/results/<name>.json` (its figures, targets,
markdown blocks, the machine and the command) beside `<name>.md`, so the page can be regenerated
after one measurement is rerun, or with `python3 benchmarks/run.py --report`. Needs only the
standard library, plus matplotlib for the plots.
"""

from __future__ import annotations

import dataclasses
import json
import string
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, Outcome, machine_text, run_text, targets_table

RESULTS = ROOT / "benchmarks" / "results"
TEMPLATE = ROOT / "benchmarks" / "template.md"
DOCS = ROOT / "docs" / "benchmarks.md"
IMAGES = ROOT / "docs" / "img"
NAMES = ["overhead", "ingest", "traffic", "reads", "faults"]


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def save(name: str, outcome: Outcome, machine: dict[str, Any], args: Any, seconds: float, results: Path = RESULTS):
    """Write `<name>.md` and `<name>.json` under `results`; returns the markdown's path."""
    command = (
        "python3 benchmarks/run.py" + (" --quick" if args.quick else "") + (f" --only {name}" if args.only else "")
    )
    record = {
        "name": name,
        "command": command,
        "quick": args.quick,
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": seconds,
        "machine": machine,
        "targets": outcome.targets,
        "sections": outcome.sections,
        "data": outcome.data,
    }
    results.mkdir(parents=True, exist_ok=True)
    when = f"Measured {record['measured_at']} with `{command}` in {seconds / 60:.1f} min"
    footer = f"\n---\n{when}; {run_text(machine)}; {machine_text(machine)}.\n"
    (results / f"{name}.md").write_text(outcome.markdown.rstrip("\n") + "\n" + footer)
    (results / f"{name}.json").write_text(json.dumps(record, default=_jsonable, indent=1) + "\n")
    return results / f"{name}.md"


def load(results: Path = RESULTS) -> dict[str, dict[str, Any]]:
    return {name: json.loads(path.read_text()) for name in NAMES if (path := results / f"{name}.json").exists()}


def _meta(record: dict[str, Any]) -> str:
    scale = "`--quick` sizes, so smaller than the targets are stated on; " if record["quick"] else ""
    return (
        f"*Measured {record['measured_at']} by `{record['command']}` ({scale}{record['seconds'] / 60:.1f} min), "
        f"{run_text(record['machine'])}.*\n"
    )


def _machines(records: dict[str, dict[str, Any]]) -> str:
    """The machine every measurement ran on; when they differ (the results are kept across runs), each with its own."""
    ran_on: dict[str, list[str]] = {}
    for name, record in records.items():
        ran_on.setdefault(machine_text(record["machine"]), []).append(name)
    if len(ran_on) <= 1:
        return next(iter(ran_on), "no results yet")
    return "; ".join(f"{machine} ({', '.join(names)})" for machine, names in ran_on.items())


def placeholders(records: dict[str, dict[str, Any]], images: dict[str, tuple[str, str]]) -> dict[str, str]:
    """Every `${name}` of the template: the sections, meta lines, target tables and image links."""
    values: dict[str, str] = {}
    for name in NAMES:
        record = records.get(name)
        missing = f"*Not measured yet: `python3 benchmarks/run.py --only {name}`.*\n"
        values[f"{name}_meta"] = _meta(record) if record else missing
        values[f"{name}_targets"] = targets_table(record["targets"]) if record else ""
        for section in (record or {}).get("sections", {}):
            values[section] = record["sections"][section]
    values["all_targets"] = targets_table(
        sorted((t for r in records.values() for t in r["targets"]), key=lambda t: t["issue"])
    )
    values["machine"] = _machines(records)
    values |= {key: f"![{alt}]({IMAGES.name}/{file})\n" for key, (file, alt) in images.items()}
    return values


class _Lenient(dict):
    """A section that a measurement did not produce (it was not run) reads as nothing."""

    def __missing__(self, key: str) -> str:
        return ""


def render(records: dict[str, dict[str, Any]], images: dict[str, tuple[str, str]], template: str) -> str:
    return string.Template(template).substitute(_Lenient(placeholders(records, images)))


def write_docs(results: Path = RESULTS, docs: Path = DOCS, images: Path = IMAGES) -> Path:
    """Regenerate the page and its plots from every saved result; returns the page's path."""
    from benchmarks import plots

    records = load(results)
    drawn = plots.draw({name: record["data"] for name, record in records.items()}, images)
    docs.write_text(render(records, drawn, TEMPLATE.read_text()))
    return docs
