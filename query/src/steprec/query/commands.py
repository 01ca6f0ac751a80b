"""The query part's `steprec` commands: talking to a running recorder."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from .client import DEFAULT_ENDPOINT, RecorderClient

_DURATION = re.compile(r"^(\d+)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(value: str) -> int:
    match = _DURATION.match(value.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration like 90m, 12h or 30d")
    return int(match[1]) * _SECONDS[match[2]]


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every command that talks to a recorder shares; `open_client` turns them into a client."""
    connection = parser.add_argument_group("connection")
    connection.add_argument("--endpoint", default=os.environ.get("STEPREC_ENDPOINT", DEFAULT_ENDPOINT),
                            help="the recorder's HOST:PORT, https:// for TLS (env STEPREC_ENDPOINT; "
                            "default 127.0.0.1:4317)")  # fmt: skip
    connection.add_argument("--token-file", type=Path, default=_env_path("STEPREC_TOKEN_FILE"), metavar="PATH",
                            help="read the bearer token from this file (env STEPREC_TOKEN_FILE, or the token "
                            "itself in STEPREC_TOKEN; never on the command line, where ps would show it)")  # fmt: skip
    for name, what in (("ca", "CA certificate to trust"), ("cert", "client certificate (mTLS)"),
                       ("key", "client private key (mTLS)")):  # fmt: skip
        connection.add_argument(f"--tls-{name}", type=Path, default=_env_path(f"STEPREC_TLS_{name.upper()}"),
                                metavar="PEM", help=f"the {what}, PEM (env STEPREC_TLS_{name.upper()})")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _env_path(name: str) -> Path | None:
    return Path(os.environ[name]) if os.environ.get(name) else None


def read_token(options: argparse.Namespace) -> str | None:
    """The bearer token of the connection options (`--token-file`, else `STEPREC_TOKEN`); a bad file is exit 2."""
    if options.token_file is None:
        return os.environ.get("STEPREC_TOKEN") or None
    try:
        token = options.token_file.read_text().strip()
    except OSError as error:
        raise ValueError(f"cannot read --token-file {options.token_file}: {error.strerror}") from None
    if not token:
        raise ValueError(f"--token-file {options.token_file} is empty")
    return token


def open_client(options: argparse.Namespace, *, timeout_seconds: float = 10.0) -> RecorderClient:
    """A client configured by the connection options; a token file that cannot be read is a bad value (exit 2)."""
    token = read_token(options) if options.token_file is not None else None
    for name in ("tls_ca", "tls_cert", "tls_key"):
        path = getattr(options, name)
        if path is not None and not path.is_file():
            raise ValueError(f"--{name.replace('_', '-')} {path} is not a readable file")
    return RecorderClient(options.endpoint, timeout_seconds=timeout_seconds, token=token,
                          tls_ca=options.tls_ca, tls_cert=options.tls_cert, tls_key=options.tls_key)  # fmt: skip


def add_client_command(
    commands: argparse._SubParsersAction, name: str, help_text: str, handler, *, timeout_seconds: float = 10.0
) -> argparse.ArgumentParser:
    """A subcommand that opens a client from the connection options and awaits `handler(client, options)`."""
    parser = commands.add_parser(name, help=help_text, description=help_text)
    add_connection_arguments(parser)

    async def run(options: argparse.Namespace) -> int:
        async with open_client(options, timeout_seconds=timeout_seconds) as client:
            return await handler(client, options)

    parser.set_defaults(run=lambda options: asyncio.run(run(options)))
    return parser


async def _prune(options: argparse.Namespace) -> int:
    cutoff = datetime.now(UTC) - timedelta(seconds=options.older_than) if options.older_than is not None else None
    async with open_client(options, timeout_seconds=300) as client:
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
