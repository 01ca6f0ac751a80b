"""The browser served by uvicorn inside the recorder's event loop, on its own socket, with the recorder's TLS.

uvicorn's `Server.serve` would install its own SIGINT/SIGTERM handlers; the recorder owns those (it drains
gRPC first), so the embedded server captures none and is stopped by the recorder. The socket is bound here,
so a port in use is an error at start-up with the address in it, and port 0 yields the port actually taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

logger = logging.getLogger(__name__)


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """The recorder's signal handlers stay: it stops this server itself, after draining gRPC."""
        yield


@dataclass(frozen=True)
class BrowserTLS:
    cert: Path | None = None
    key: Path | None = None
    client_ca: Path | None = None


class BrowserServer:
    """A started browser: its `url`, and `stop()`."""

    def __init__(self, server: _EmbeddedServer, task: asyncio.Task, url: str) -> None:
        self._server, self._task, self.url = server, task, url

    async def stop(self) -> None:
        self._server.should_exit = True
        await self._task


def bind(listen: str) -> socket.socket:
    """A listening socket on HOST:PORT; OSError (address in use, say) names the address."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, int(port)), family=family, backlog=128)
    except OSError as error:
        raise OSError(error.errno, f"the browser cannot listen on {listen}: {error.strerror}") from None


async def start_browser(app: ASGIApp, sock: socket.socket, tls: BrowserTLS) -> BrowserServer:
    config = uvicorn.Config(
        app, lifespan="off", log_config=None, access_log=False, server_header=False,
        ssl_certfile=tls.cert, ssl_keyfile=tls.key, ssl_ca_certs=tls.client_ca,
        ssl_cert_reqs=ssl.CERT_REQUIRED if tls.client_ca else ssl.CERT_NONE,
    )  # fmt: skip
    server = _EmbeddedServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="steprec-browser")
    while not server.started:
        if task.done():
            task.result()  # raises what stopped it
            raise RuntimeError("the browser stopped while starting")
        await asyncio.sleep(0.01)
    host, port = sock.getsockname()[:2]
    shown_host = f"[{host}]" if ":" in host else host
    return BrowserServer(server, task, f"{'https' if tls.cert else 'http'}://{shown_host}:{port}/")
