"""`steprec serve` and `steprec demo`, registered into the `steprec` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path


def _listen_address(value: str) -> str:
    host, separator, port = value.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (port 0-65535; 0 picks a free one)")
    return value


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer")
    return int(value)


def _readable_file(value: str) -> Path:
    path = Path(value)
    if not path.is_file() or not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{value!r} is not a readable file")
    return path


def _read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as error:
        raise SystemExit(f"steprec serve: cannot read the token file {path}: {error.strerror}") from None
    if not token:
        raise SystemExit(f"steprec serve: the token file {path} is empty")
    return token


def _serve(options: argparse.Namespace) -> int:
    from .server import ServeOptions, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options_ = ServeOptions(
        listen=options.listen,
        data_dir=options.data,
        fsync=options.fsync,
        max_snapshots_per_run=options.max_snapshots_per_run,
        token=_read_token(options.token_file) if options.token_file else os.environ.get("STEPREC_TOKEN") or None,
        tls_cert=options.tls_cert,
        tls_key=options.tls_key,
        tls_client_ca=options.tls_client_ca,
    )
    asyncio.run(serve(options_))
    return 0


def _demo(options: argparse.Namespace) -> int:
    from .demo import run_demo

    return asyncio.run(run_demo(options.data))


def register(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the recorder daemon",
        description="Receive OTLP log records from StepRecorder, store them in DuckDB, answer queries.",
    )
    serve.add_argument(
        "--listen",
        type=_listen_address,
        default=os.environ.get("STEPREC_LISTEN", "127.0.0.1:4317"),
        help="HOST:PORT for OTLP ingest and queries (default 127.0.0.1:4317, loopback only; env STEPREC_LISTEN)",
    )
    serve.add_argument(
        "--data",
        type=Path,
        default=Path(os.environ.get("STEPREC_DATA", "steprec-data")),
        help="folder holding the DuckDB file (default ./steprec-data; env STEPREC_DATA)",
    )
    serve.add_argument(
        "--fsync",
        action="store_true",
        default=os.environ.get("STEPREC_FSYNC", "") == "1",
        help="fsync the write-ahead log before acknowledging, so acknowledged records also survive power loss "
        "(without it they survive any crash of the recorder process; env STEPREC_FSYNC=1)",
    )
    serve.add_argument(
        "--max-snapshots-per-run",
        type=_positive_int,
        default=_positive_int(os.environ["STEPREC_MAX_SNAPSHOTS_PER_RUN"])
        if os.environ.get("STEPREC_MAX_SNAPSHOTS_PER_RUN")
        else None,
        metavar="N",
        help="keep at most N snapshots per run (plus the newest and the newest complete) unless the run asks "
        "for its own bound; default: keep all (env STEPREC_MAX_SNAPSHOTS_PER_RUN)",
    )
    serve.add_argument(
        "--token-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="require 'authorization: Bearer <token>' on every call but health checks; the token is the "
        "file's content (or set STEPREC_TOKEN)",
    )
    for flag, what in (
        ("--tls-cert", "PEM certificate chain to serve TLS with (with --tls-key)"),
        ("--tls-key", "PEM private key of --tls-cert"),
        ("--tls-client-ca", "PEM CA that client certificates must be signed by: mutual TLS"),
    ):
        serve.add_argument(flag, type=_readable_file, default=None, metavar="PATH", help=what)
    serve.set_defaults(run=_serve)

    demo = commands.add_parser(
        "demo",
        help="record a demo agent end to end and read it back",
        description="Start a recorder on a free loopback port, run demo agents through it, read the runs back.",
    )
    demo.add_argument("--data", type=Path, default=None, help="keep the recorder's data in this folder (default: a temporary one)")
    demo.set_defaults(run=_demo)
