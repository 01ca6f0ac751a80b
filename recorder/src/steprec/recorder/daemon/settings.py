"""`steprec serve` settings: each one a flag, an environment variable and a config-file key.

A flag wins over the environment, the environment over the config file
(`--config steprec.toml`), the config file over the default. Every value from
any source goes through the same parser, so a bad one is refused with the
same message wherever it came from; an unknown config key is an error, never
ignored.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..store.message_cache import DEFAULT_CACHE_BYTES
from ..store.run_state import DEFAULT_RUN_STATE_BYTES


def listen_address(value: str) -> str:
    host, separator, port = value.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT (port 0-65535; 0 picks a free one)")
    return value


DEFAULT_UI_LISTEN = "127.0.0.1:4319"
LAKE_KEEP_SECONDS = 3600
"""How long lake maintenance keeps an expired snapshot's files: reads still running on one finish."""


def ui_address(value: str) -> str | None:
    """HOST:PORT for the run browser, or `off` (None)."""
    if value.strip().lower() == "off":
        return None
    try:
        return listen_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not HOST:PORT or off") from None


def positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{value!r} is not a positive integer")
    return int(value)


def readable_file(value: str) -> Path:
    path = Path(value)
    if not path.is_file() or not os.access(path, os.R_OK):
        raise ValueError(f"{value!r} is not a readable file")
    return path


def journal_folders(value: str) -> tuple[Path, ...]:
    """Folders separated by the path separator (`:`); each must be a folder if it exists (it may appear later)."""
    folders = tuple(Path(part) for part in value.split(os.pathsep) if part)
    for folder in folders:
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{str(folder)!r} is not a folder")
    return folders


def log_format(value: str) -> str:
    if value not in ("text", "json"):
        raise ValueError(f"{value!r} is not a log format (text or json)")
    return value


def boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{value!r} is not a boolean (true/false, 1/0, yes/no)")


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "STEPREC_" + self.name.upper()


SETTINGS = (
    Setting("listen", listen_address, "127.0.0.1:4317", "HOST:PORT for OTLP ingest and queries; loopback by default"),
    Setting("data", Path, Path("steprec-data"), "folder holding the DuckDB file and the write-ahead log"),
    Setting("fsync", boolean, False, "fsync the write-ahead log before acknowledging, so acknowledged records "
            "survive power loss too (without it they survive any crash of the recorder process)"),
    Setting("max_snapshots_per_run", positive_int, None, "keep at most N snapshots per run (plus the newest and "
            "the newest complete) unless the run asks for its own bound; none keeps all"),
    Setting("duckdb_memory_mib", positive_int, 1024, "memory DuckDB may use for its page cache and queries, in "
            "MiB (it spills to disk beyond); one of the parts of the recorder's memory budget (docs/storage.md)"),
    Setting("message_cache_mib", positive_int, DEFAULT_CACHE_BYTES >> 20, "memory for recently written or read "
            "message bodies, in MiB, so reading a live run skips DuckDB"),
    Setting("run_state_mib", positive_int, DEFAULT_RUN_STATE_BYTES >> 20, "memory for ingest's state of recently "
            "written runs (replay keys, last references), in MiB; a run dropped beyond it is loaded from the "
            "database when it returns"),
    Setting("lake", str, None, "store in a DuckLake that many recorders share instead of the DuckDB file: its "
            "catalog, postgres:dbname=... host=... user=... (or a .ducklake file, for one recorder); needs "
            "--lake-data (docs/lake.md)"),
    Setting("lake_data", str, None, "where the lake's Parquet files go: s3://bucket/prefix (S3-compatible, with "
            "--s3-endpoint-url and the usual AWS credentials) or a folder; media blobs go beside it, "
            "<lake-data>-media, unless --media says otherwise"),
    Setting("lake_maintain_seconds", positive_int, 600, "in lake mode, merge small files and expire snapshots "
            "older than an hour this often (steprec lake maintain does it once)"),
    Setting("media", str, None, "where media blobs go: s3://bucket/prefix (S3-compatible; credentials from the "
            "usual AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY environment or AWS config) or a folder; "
            "none: <data>/media"),
    Setting("s3_endpoint_url", str, None, "S3 endpoint for non-AWS storage, e.g. http://127.0.0.1:9000"),
    Setting("s3_region", str, None, "S3 region (else the AWS configuration's)"),
    Setting("s3_access_key_id", str, None, "S3 access key id (else AWS_ACCESS_KEY_ID or the AWS configuration)"),
    Setting("s3_secret_access_key_file", readable_file, None, "file holding the S3 secret access key "
            "(else AWS_SECRET_ACCESS_KEY or the AWS configuration)"),
    Setting("media_threshold", positive_int, 64 * 1024, "string parts of this many bytes or more are stored "
            "once as media+sha256:// blobs under <data>/media (BinaryContent always is)"),
    Setting("token_file", readable_file, None, "require 'authorization: Bearer <token>' on every call but health "
            "checks; the token is the file's content (STEPREC_TOKEN may hold the token itself)"),
    Setting("tls_cert", readable_file, None, "PEM certificate chain to serve TLS with (with --tls-key)"),
    Setting("tls_key", readable_file, None, "PEM private key of --tls-cert"),
    Setting("tls_client_ca", readable_file, None, "PEM CA that client certificates must be signed by: mutual TLS"),
    Setting("adopt_journals", journal_folders, (), "deliver the journals that dead agent processes left in this "
            "folder (repeatable; the environment and config file take several, separated by ':'); a recorder on "
            "loopback also adopts its endpoint's default journal folder"),
    Setting("log_format", log_format, "text", "text for people, json for log pipelines (one object per line)"),
    Setting("ui_listen", ui_address, DEFAULT_UI_LISTEN, "HOST:PORT to serve the run browser on (pages, /api/, "
            "/media/; same token and TLS as gRPC); off: none. If the default port is taken, the recorder says so "
            "and serves without it"),
    Setting("metrics_listen", listen_address, None, "HOST:PORT to serve Prometheus metrics on (GET /metrics; "
            "needs the token too when one is set); none: off"),
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, metavar="PATH",
                        help="TOML file with any of the settings below, by their underscore names")  # fmt: skip
    for setting in SETTINGS:
        shown = "none" if setting.default is None else setting.default
        help_text = f"{setting.help} (env {setting.env}; default {shown})"
        if setting.parse is boolean:
            parser.add_argument(setting.flag, action="store_const", const=True, default=None, help=help_text)
        elif setting.parse is journal_folders:
            parser.add_argument(setting.flag, action="append", default=None, metavar="DIR", help=help_text)
        else:
            parser.add_argument(setting.flag, default=None, metavar=setting.name.upper(), help=help_text)


def resolve(options: argparse.Namespace, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Every setting's value, from flag, environment, config file or default; ValueError names the culprit."""
    environ = os.environ if environ is None else environ
    config = _load_config(options.config) if options.config else {}
    values = {}
    for setting in SETTINGS:
        raw, source = getattr(options, setting.name), setting.flag
        if raw is None and setting.env in environ:
            raw, source = environ[setting.env], setting.env
        if raw is None and setting.name in config:
            raw, source = config[setting.name], f"{options.config}: {setting.name}"
        if raw is None:
            values[setting.name] = setting.default
            continue
        if setting.parse is journal_folders:  # repeated flags, or a TOML list or string
            folders = raw if isinstance(raw, list) else [raw]
            if not all(isinstance(folder, str) for folder in folders):
                raise ValueError(f"{source}: {raw!r} is not a folder or a list of folders")
            raw = os.pathsep.join(folders)
        try:
            values[setting.name] = raw if isinstance(raw, bool) else setting.parse(str(raw))
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None
    return values


def _load_config(path: Path) -> dict[str, Any]:
    try:
        config = tomllib.loads(path.read_text())
    except OSError as error:
        raise ValueError(f"cannot read the config file {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"the config file {path} is not valid TOML: {error}") from None
    known = {setting.name for setting in SETTINGS}
    if unknown := sorted(set(config) - known):
        raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return config
