"""DuckDB's DuckLake, PostgreSQL and httpfs extensions, loaded from their PyPI packages, never downloaded.

`pip install steprec-recorder[lake]` brings `duckdb-extension-<name>` wheels holding the extension files; they
are installed into an extension folder of the recorder's own (`<data>/duckdb-extensions`) on first use, so a
recorder in a locked-down network starts the same as anywhere.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import duckdb

EXTENSIONS = {"ducklake": "ducklake", "postgres": "postgres_scanner", "httpfs": "httpfs"}
"""PyPI package suffix -> the name DuckDB loads it by."""


class MissingExtension(RuntimeError):
    """A lake extension's package is not installed."""


def _packaged_file(package: str) -> Path:
    spec = importlib.util.find_spec(f"duckdb_extension_{package}")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtension(
            f"lake mode needs DuckDB's {package} extension: pip install 'steprec-recorder[lake]'"
            f" (duckdb-extension-{package}=={duckdb.__version__})"
        )
    found = sorted(Path(spec.submodule_search_locations[0]).rglob("*.duckdb_extension"))
    if not found:
        raise MissingExtension(f"the package duckdb-extension-{package} holds no extension file")
    return found[0]


def extension_config(folder: Path, *, autoload: bool) -> dict[str, str]:
    """DuckDB settings that take extensions from `folder` only: never installed from the network."""
    return {
        "extension_directory": str(folder),
        "autoinstall_known_extensions": "false",
        "autoload_known_extensions": str(autoload).lower(),
    }


def connect_with_extensions(folder: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the three lake extensions installed from their packages (once) and loaded."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    connection = duckdb.connect(config=extension_config(folder, autoload=False))
    platform = connection.execute("PRAGMA platform").fetchone()[0]
    for package, name in EXTENSIONS.items():
        if not (folder / f"v{duckdb.__version__}" / platform / f"{name}.duckdb_extension").exists():
            connection.execute(f"INSTALL '{_packaged_file(package)}'")
        connection.execute(f"LOAD {name}")
    return connection
