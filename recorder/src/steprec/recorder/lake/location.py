"""Where a lake is: DuckLake's catalog string and its data folder or S3 prefix, checked, and attached.

`--lake` takes DuckLake's own catalog strings (`postgres:dbname=... host=...`, or a `.ducklake` file for one
machine); `--lake-data` an `s3://bucket/prefix` (endpoint from `--s3-endpoint-url`, credentials by the standard
AWS chain) or a folder. Media blobs go beside the data (`<prefix>-media`), never inside it: DuckLake may delete
files under its data path that its catalog does not list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import duckdb

from .extensions import connect_with_extensions, extension_config


def redacted(catalog: str) -> str:
    """The catalog string with any password hidden, for messages and logs."""
    return re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", catalog, flags=re.IGNORECASE)


def sql_name(value: str) -> str:
    """`value` as a quoted SQL identifier (DuckDB names the lake after its catalog string, spaces and all)."""
    return '"' + value.replace('"', '""') + '"'


def sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@dataclass(frozen=True)
class LakeLocation:
    catalog: str
    data: str
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not (self.catalog.startswith("postgres:") or self.catalog.endswith(".ducklake")):
            raise ValueError(
                f"--lake {redacted(self.catalog)!r} is not a DuckLake catalog: expected"
                " 'postgres:dbname=... host=... user=...' or a path ending in .ducklake"
            )
        if self.data.startswith("s3://"):
            bucket, _, prefix = self.data.removeprefix("s3://").partition("/")
            if not bucket or not prefix.strip("/"):
                raise ValueError(f"--lake-data {self.data!r} needs a bucket and a prefix: s3://bucket/prefix")
        elif "://" in self.data:
            raise ValueError(f"--lake-data {self.data!r} is neither s3://bucket/prefix nor a folder")
        if self.s3_endpoint_url is not None and urlsplit(self.s3_endpoint_url).scheme not in ("http", "https"):
            raise ValueError(f"--s3-endpoint-url {self.s3_endpoint_url!r} is not an http:// or https:// URL")

    @property
    def shared(self) -> bool:
        """Whether other recorders can write the same lake (a PostgreSQL catalog), so run ids are claimed there."""
        return self.catalog.startswith("postgres:")

    @property
    def postgres(self) -> str | None:
        """The libpq connection string of a PostgreSQL catalog."""
        return self.catalog.removeprefix("postgres:") if self.shared else None

    @property
    def on_s3(self) -> bool:
        return self.data.startswith("s3://")

    def data_path(self) -> str:
        if self.on_s3:
            return self.data.rstrip("/") + "/"
        return str(Path(self.data).resolve()) + "/"

    def media_location(self) -> str:
        """Where media blobs go unless `--media` says otherwise: beside the data, shared by every recorder."""
        return self.data.rstrip("/") + "-media"

    def connect(self, extension_dir: Path) -> tuple[duckdb.DuckDBPyConnection, str]:
        """A DuckDB session whose main database is the lake, and the name DuckDB gave it.

        The lake is the main database, not an attached one, because `USE` is per cursor and every cursor must
        find the tables where file mode finds them. DuckLake takes its data path when the lake is created, so a
        first session attaches it with `DATA_PATH` (creating it if new) before the real one opens it.
        """
        if not self.on_s3:
            Path(self.data).mkdir(parents=True, exist_ok=True, mode=0o700)
        first = connect_with_extensions(extension_dir)
        try:
            self._add_secret(first)
            first.execute(f"ATTACH {sql_text('ducklake:' + self.catalog)} AS steprec_lake"
                          f" (DATA_PATH {sql_text(self.data_path())})")  # fmt: skip
        except duckdb.Error as error:
            raise ValueError(f"cannot attach the lake {redacted(self.catalog)!r}: {redacted(str(error))}") from None
        finally:
            first.close()
        connection = duckdb.connect(f"ducklake:{self.catalog}", config=extension_config(extension_dir, autoload=True))
        for name in ("httpfs", "postgres_scanner"):
            connection.execute(f"LOAD {name}")
        self._add_secret(connection)
        return connection, connection.execute("SELECT current_database()").fetchone()[0]

    def _add_secret(self, connection: duckdb.DuckDBPyConnection) -> None:
        if self.on_s3:
            connection.execute(f"CREATE OR REPLACE SECRET steprec_lake_s3 ({', '.join(self._s3_secret())})")

    def _s3_secret(self) -> list[str]:
        """DuckDB's S3 secret, its credentials resolved by boto3's standard chain unless given."""
        import boto3  # the standard AWS chain: environment, config files, instance roles

        session = boto3.session.Session(region_name=self.s3_region)
        credentials = session.get_credentials()
        key_id = self.s3_access_key_id or (credentials.access_key if credentials else None)
        secret = self.s3_secret_access_key or (credentials.secret_key if credentials else None)
        if not key_id or not secret:
            raise ValueError("--lake-data on S3 needs credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        options = ["TYPE s3", f"KEY_ID {sql_text(key_id)}", f"SECRET {sql_text(secret)}",
                   f"REGION {sql_text(session.region_name or 'us-east-1')}"]  # fmt: skip
        if credentials and credentials.token and not self.s3_access_key_id:
            options.append(f"SESSION_TOKEN {sql_text(credentials.token)}")
        if self.s3_endpoint_url:
            endpoint = urlsplit(self.s3_endpoint_url)
            options += [f"ENDPOINT {sql_text(endpoint.netloc)}", "URL_STYLE 'path'",
                        f"USE_SSL {'true' if endpoint.scheme == 'https' else 'false'}"]  # fmt: skip
        return options
