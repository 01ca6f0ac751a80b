"""`steprec serve` and `steprec demo`, registered into the `steprec` command."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from .allocators import restart_with_settings
from .logs import configure_logging
from .settings import LAKE_KEEP_SECONDS, add_arguments, positive_int, resolve


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


def _lake_maintain(options: argparse.Namespace) -> int:
    from ..lake.location import LakeLocation
    from ..lake.maintenance import maintain

    location = LakeLocation(options.lake, options.lake_data, s3_endpoint_url=options.s3_endpoint_url)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "steprec" / "duckdb-extensions"
    connection, name = location.connect(cache)
    try:
        result = maintain(connection, name, keep_seconds=options.keep_seconds)
    finally:
        connection.close()
    print(f"data files {result.files_before} -> {result.files_after}; {result.snapshots_expired} snapshots"
          f" expired; {result.files_deleted} files deleted")  # fmt: skip
    return 0


def _register_lake(commands: argparse._SubParsersAction) -> None:
    what = "Look after a lake many recorders share (docs/lake.md)."
    parser = commands.add_parser("lake", help="look after a lake (steprec serve --lake)", description=what)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    what = ("merge the lake's small files, expire old snapshots and delete files no snapshot reads; recorders also"
            " do this every --lake-maintain-seconds")  # fmt: skip
    maintain = actions.add_parser("maintain", help=what, description=what)
    for setting, help_text in (("lake", "the DuckLake catalog, as for steprec serve"),
                               ("lake_data", "the lake's data, as for steprec serve")):  # fmt: skip
        flag, env = "--" + setting.replace("_", "-"), "STEPREC_" + setting.upper()
        maintain.add_argument(flag, default=os.environ.get(env), required=env not in os.environ,
                              help=f"{help_text} (env {env})")  # fmt: skip
    maintain.add_argument("--s3-endpoint-url", default=os.environ.get("STEPREC_S3_ENDPOINT_URL"),
                          help="S3 endpoint for non-AWS storage (env STEPREC_S3_ENDPOINT_URL)")  # fmt: skip
    maintain.add_argument("--keep-seconds", type=positive_int, default=LAKE_KEEP_SECONDS, metavar="SECONDS",
                          help=f"keep snapshots this recent (default {LAKE_KEEP_SECONDS})")  # fmt: skip
    maintain.set_defaults(run=_lake_maintain)


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
    _register_lake(commands)
