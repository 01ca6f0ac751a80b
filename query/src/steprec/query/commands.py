"""The query part's `steprec` commands: talking to a running recorder."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
from datetime import UTC, datetime, timedelta

from .client import DEFAULT_ENDPOINT, RecorderClient

_DURATION = re.compile(r"^(\d+)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(value: str) -> int:
    match = _DURATION.match(value.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration like 90m, 12h or 30d")
    return int(match[1]) * _SECONDS[match[2]]


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", default=os.environ.get("STEPREC_ENDPOINT", DEFAULT_ENDPOINT),
                        help="the recorder's HOST:PORT (env STEPREC_ENDPOINT; default 127.0.0.1:4317)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


async def _prune(options: argparse.Namespace) -> int:
    cutoff = datetime.now(UTC) - timedelta(seconds=options.older_than) if options.older_than is not None else None
    async with RecorderClient(options.endpoint, timeout_seconds=300) as client:
        counts = await client.prune(
            started_before=cutoff, conversation_id=options.conversation, dry_run=options.dry_run
        )
    if options.json:
        print(json.dumps({"dry_run": options.dry_run, **counts}))
    else:
        verb = "would remove" if options.dry_run else "removed"
        print(
            f"{verb} {counts['runs']} runs ({counts['events']} events, {counts['snapshots']} snapshots, "
            f"{counts['tool_effects']} tool effects), {counts['messages']} unreferenced messages "
            f"({counts['message_bytes']:,} bytes) and {counts['media_blobs']} media blobs "
            f"({counts['media_bytes']:,} bytes)"
        )
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    prune = commands.add_parser(
        "prune",
        help="remove old runs and the messages nothing refers to any more",
        description="Remove whole runs by age and/or conversation, then every stored message no retained "
        "snapshot refers to. Needs at least one of --older-than and --conversation.",
    )
    prune.add_argument("--older-than", type=duration_seconds, metavar="DURATION",
                       help="runs that started longer ago than this (90m, 12h, 30d)")  # fmt: skip
    prune.add_argument("--conversation", metavar="ID", help="runs of this conversation")
    prune.add_argument("--dry-run", action="store_true", help="count what would go, remove nothing")
    add_connection_arguments(prune)

    def run(options: argparse.Namespace) -> int:
        if options.older_than is None and options.conversation is None:
            prune.error("give --older-than and/or --conversation")
        return asyncio.run(_prune(options))

    prune.set_defaults(run=run)
