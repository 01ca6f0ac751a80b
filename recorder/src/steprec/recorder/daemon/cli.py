"""`steprec serve` and `steprec demo`, registered into the `steprec` command."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from .allocators import restart_with_settings
from .logs import configure_logging
from .settings import add_arguments, resolve


def _read_secret(path: Path) -> str:
    secret = path.read_text().strip()
    if not secret:
        raise ValueError(f"the file {path} is empty")
    return secret


def _serve(options: argparse.Namespace) -> int:
    from .server import ServeOptions, serve

    settings = resolve(options)
    restart_with_settings()  # run from a command line without the allocator settings: starts over with them
    configure_logging(settings.pop("log_format"))
    token_file = settings.pop("token_file")
    secret_file = settings.pop("s3_secret_access_key_file")
    serve_options = ServeOptions(
        listen=settings.pop("listen"),
        data_dir=settings.pop("data"),
        token=_read_secret(token_file) if token_file else os.environ.get("STEPREC_TOKEN") or None,
        s3_secret_access_key=_read_secret(secret_file) if secret_file else None,
        **settings,
    )
    asyncio.run(serve(serve_options))
    return 0


def _demo(options: argparse.Namespace) -> int:
    from .demo import run_demo

    return asyncio.run(run_demo(options.data, keep_serving=options.serve))


def register(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the recorder daemon",
        description="Receive OTLP log records from StepRecorder, store them in DuckDB, answer queries.",
    )
    add_arguments(serve)
    serve.set_defaults(run=_serve)

    demo = commands.add_parser(
        "demo",
        help="record a demo agent end to end and read it back",
        description="Start a recorder on a free loopback port, run demo agents through it, read the runs back.",
    )
    demo.add_argument(
        "--data", type=Path, default=None, help="keep the recorder's data in this folder (default: a temporary one)"
    )
    demo.add_argument(
        "--serve", action="store_true",
        help="then leave the recorder and its run browser up on the demo's data (prints the URL; Ctrl-C stops)",
    )  # fmt: skip
    demo.set_defaults(run=_demo)
