"""The services a lake needs, started by the tests: Debian's PostgreSQL in a temporary data folder, moto's S3.

PostgreSQL refuses to run as root; where the tests run as root (CI containers) its folder is handed to the
`postgres` user the Debian package creates, and its programs run as that user.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3
from moto.server import ThreadedMotoServer

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto logs every request


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def postgres_bin() -> Path:
    """Debian's PostgreSQL programs (not on PATH there): the newest version installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    if program := shutil.which("pg_ctl"):
        return Path(program).resolve().parent
    raise RuntimeError("the lake tests need PostgreSQL: apt-get install postgresql (scripts/dev.py does)")


@contextmanager
def postgres() -> Iterator[str]:
    """A PostgreSQL server on 127.0.0.1 with a database `lake`; yields the libpq connection string.

    Its folder is a new one in the system's temporary folder, not pytest's: that one is owner-only, closed to
    the `postgres` user.
    """
    folder = Path(tempfile.mkdtemp(prefix="steprec-postgres-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    binaries, port, data = postgres_bin(), free_port(), folder / "data"

    def run(*command: str) -> None:
        done = subprocess.run([*as_user, *command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            raise RuntimeError(f"{Path(command[0]).name} failed ({done.returncode}): {done.stderr.strip()}")

    run(str(binaries / "initdb"), "-D", str(data), "-U", "steprec", "--auth=trust", "-E", "UTF8")
    settings = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    run(str(binaries / "pg_ctl"), "-D", str(data), "-l", str(folder / "postgres.log"), "-w", "-o", settings, "start")
    try:
        run(str(binaries / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "steprec", "lake")
        yield f"dbname=lake host=127.0.0.1 port={port} user=steprec"
    finally:
        run(str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def s3_server(bucket: str) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 with `bucket` made; yields its endpoint URL. Sets the AWS variables the
    recorders (child processes) inherit."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    endpoint = f"http://127.0.0.1:{port}"
    try:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
