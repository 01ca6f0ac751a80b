"""`steprec runs | tree | events | effects | snapshot | continue | fork`: reading a recorder from a shell.

Tables and trees for people by default (rich), `--json` for scripts. Exit codes scripts can rely
on: 0 found, 3 not found, 4 recorder unreachable, 5 refused (token), 2 bad arguments (cli.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from datetime import UTC, datetime
from typing import Any

from pydantic_ai.messages import ModelMessagesTypeAdapter
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from .client import RecorderClient
from .commands import add_client_command, duration_seconds
from .resume import continue_run, fork_run


def _plain(value: Any) -> Any:
    """Records as JSON-ready values: dataclasses to dicts, datetimes to ISO 8601."""
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _print_json(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=False, indent=2))


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    Console().print(table)


def _label(run) -> str:
    fork = f" (fork of snapshot {run.forked_from_snapshot_index})" if run.forked_from_run_id else ""
    return f"{run.agent_name or '?'}  {run.run_id}  [{run.outcome}]{fork}"


async def _runs(client: RecorderClient, options: argparse.Namespace) -> int:
    since = datetime.fromtimestamp(time.time() - options.since, UTC) if options.since else None
    runs = await client.list_runs(
        conversation_id=options.conversation, parent_run_id=options.parent, agent_name=options.agent,
        outcome=options.outcome, started_after=since,
    )  # fmt: skip
    if options.json:
        _print_json(_plain(runs))
    else:
        rows = [[r.started_at.isoformat(timespec="seconds"), r.run_id, r.agent_name, r.outcome, r.conversation_id,
                 r.parent_run_id] for r in runs]  # fmt: skip
        _table(f"{len(runs)} runs", ["started", "run", "agent", "outcome", "conversation", "parent"], rows)
    return 0


async def _tree(client: RecorderClient, options: argparse.Namespace) -> int:
    tree = await client.run_tree(options.run_id)
    if tree is None:
        raise LookupError(f"no run {options.run_id!r} was recorded")
    if options.json:
        _print_json([{"depth": depth, **_plain(run)} for depth, run in tree.walk()])
        return 0
    root = Tree(_label(tree.run))

    def add(node: Tree, subtree) -> None:
        for child in subtree.children:
            add(node.add(_label(child.run)), child)

    add(root, tree)
    Console().print(root)
    return 0


async def _events(client: RecorderClient, options: argparse.Namespace) -> int:
    if await client.get_run(options.run_id) is None:
        raise LookupError(f"no run {options.run_id!r} was recorded")
    events = await client.list_events(options.run_id)
    if options.json:
        _print_json(_plain(events))
    else:
        rows = [[e.timestamp.isoformat(timespec="milliseconds"), e.step_index, e.kind, e.tool_name, e.error]
                for e in events]  # fmt: skip
        _table(f"{len(events)} events of {options.run_id}", ["time", "step", "kind", "tool", "error"], rows)
    return 0


async def _effects(client: RecorderClient, options: argparse.Namespace) -> int:
    if await client.get_run(options.run_id) is None:
        raise LookupError(f"no run {options.run_id!r} was recorded")
    effects = await (client.list_unresolved_tool_effects if options.unresolved else client.list_tool_effects)(
        options.run_id
    )
    if options.json:
        _print_json(_plain(effects))
    else:
        rows = [[e.tool_call_id, e.tool_name, e.status, e.idempotency_key, e.effect_summary] for e in effects]
        _table(f"{len(effects)} tool effects", ["call", "tool", "status", "idempotency key", "summary"], rows)
    return 0


async def _snapshot(client: RecorderClient, options: argparse.Namespace) -> int:
    if options.at is not None:
        snapshot = await client.get_snapshot(options.run_id, options.at)
    else:
        snapshot = await client.latest_snapshot(options.run_id, include_interrupted=options.include_interrupted)
    if snapshot is None:
        raise LookupError(f"run {options.run_id!r} has no such snapshot")
    info = {f.name: getattr(snapshot, f.name) for f in dataclasses.fields(snapshot) if f.name != "messages"}
    messages = ModelMessagesTypeAdapter.dump_python(snapshot.messages, mode="json")
    if options.json:
        _print_json({**_plain(info), "messages": messages})
    else:
        _table(f"snapshot {snapshot.snapshot_index} of {snapshot.run_id}", ["field", "value"],
               [[key, value] for key, value in info.items()] + [["messages", len(messages)]])  # fmt: skip
    return 0


async def _history(client: RecorderClient, options: argparse.Namespace) -> int:
    """`continue` and `fork`: the history as pydantic-ai message JSON, ready for message_history."""
    if options.command == "fork":
        history = await fork_run(client, run_id=options.run_id, include_interrupted=options.include_interrupted,
                                 at=options.at)  # fmt: skip
    else:
        history = await continue_run(client, run_id=options.run_id, include_interrupted=options.include_interrupted)
    print(ModelMessagesTypeAdapter.dump_json(history, indent=2 if not options.json else None).decode())
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    def command(name: str, help_text: str, handler, *, needs_run: bool = True) -> argparse.ArgumentParser:
        parser = add_client_command(commands, name, help_text, handler)
        if needs_run:
            parser.add_argument("run_id", metavar="RUN", help="the run id")
        return parser

    runs = command("runs", "list recorded runs, oldest first", _runs, needs_run=False)
    runs.add_argument("--conversation", metavar="ID")
    runs.add_argument("--parent", metavar="RUN", help="delegates of this run")
    runs.add_argument("--agent", metavar="NAME")
    runs.add_argument("--outcome", choices=["running", "completed", "failed"])
    runs.add_argument("--since", type=duration_seconds, metavar="DURATION", help="started within 90m, 12h, 30d ...")
    command("tree", "a run with every delegate and fork below it", _tree)
    command("events", "a run's step events in write order", _events)
    effects = command("effects", "a run's tool-effect ledger", _effects)
    effects.add_argument("--unresolved", action="store_true", help="only calls that may or may not have happened")
    for name, help_text, handler in (
        ("snapshot", "a run's newest snapshot, or --at N", _snapshot),
        ("continue", "print the history to continue a run from, as message JSON", _history),
        ("fork", "print the history to fork a run from (--at N for an earlier snapshot)", _history),
    ):
        parser = command(name, help_text, handler)
        parser.add_argument("--include-interrupted", action="store_true", help="consider interrupted snapshots too")
        if name != "continue":
            parser.add_argument("--at", type=int, metavar="N", help="a given retained snapshot index")
