"""The run browser as one ASGI app: routes, the token gate, security headers, autoescaping templates.

It reads the recorder's own store in-process (no gRPC hop) and is served in the recorder's event loop
(`serving.py`). Every response carries a Content-Security-Policy that allows script only from `/static/`,
so text from a model or tool that reaches a page can never run even if escaping were missed, and a
`Server-Timing` header with the time the app took, which the browser's developer tools and the benchmark read.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..querier.sql import QuerySlots
from ..store.duckdb_store import DuckDBStore
from . import api, blobs, pages
from .access import Token, TokenGate

HERE = Path(__file__).parent
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; media-src 'self';"
    " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class SecurityHeaders:
    """CSP, no sniffing, no referrer, no framing on every response, and `Server-Timing: app;dur=<ms>`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def headed(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(name, value) for name, value in message.get("headers", [])]
                present = {name.lower() for name, _ in headers}
                for name, value in (
                    (b"content-security-policy", PAGE_POLICY.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY"),
                ):
                    if name not in present:
                        headers.append((name, value))
                headers.append((b"server-timing", f"app;dur={(time.perf_counter() - started) * 1000:.2f}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, headed)


def when(ns: int | None) -> str:
    """Unix nanoseconds as a UTC time to the millisecond."""
    if ns is None:
        return ""
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def lasted(start_ns: int | None, end_ns: int | None) -> str:
    if start_ns is None or end_ns is None:
        return ""
    return milliseconds((end_ns - start_ns) / 1e6)


def milliseconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.1f} ms"


def _templates() -> Jinja2Templates:
    environment = Environment(
        loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True), auto_reload=False
    )
    environment.filters.update(when=when, ms=milliseconds)
    environment.globals.update(lasted=lasted)
    return Jinja2Templates(env=environment)


async def _refused(request: Request, error: HTTPException) -> Response:
    """A 400 or 404 that says what was wrong: JSON under /api/, a page elsewhere."""
    if request.url.path.startswith(("/api/", "/media/")):
        return JSONResponse({"error": error.detail}, status_code=error.status_code)
    templates = request.app.state.templates
    return templates.TemplateResponse(
        request, "error.html", {"status": error.status_code, "detail": error.detail}, status_code=error.status_code
    )


def browser_app(store: DuckDBStore, *, endpoint: str, token: str | None, sql_slots: QuerySlots) -> Starlette:
    """The browser over `store`; `endpoint` is the gRPC address its commands name, `token` the recorder's."""
    routes = [
        Route("/", pages.runs, name="runs"),
        Route("/runs/{run_id:path}/tree", pages.tree, name="tree"),
        Route("/runs/{run_id:path}", pages.run, name="run"),
        Route("/conversations", pages.conversations, name="conversations"),
        Route("/conversations/{conversation_id:path}", pages.conversation, name="conversation"),
        Route("/recovery", pages.recovery, name="recovery"),
        Route("/sql", pages.sql, name="sql"),
        Route("/login", pages.login, methods=["GET", "POST"], name="login"),
        Route("/logout", pages.logout, methods=["POST"], name="logout"),
        Route("/media/{sha256}", blobs.blob, name="media"),
        Route("/api/runs", api.runs),
        Route("/api/runs/{run_id:path}/below", api.below),
        Route("/api/runs/{run_id:path}", api.run),
        Route("/api/conversations", api.conversations),
        Route("/api/recovery", api.recovery),
        Route("/api/sql", api.sql),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    secret = Token(token) if token else None
    middleware = [Middleware(SecurityHeaders), *([Middleware(TokenGate, token=secret)] if secret else [])]
    app = Starlette(routes=routes, middleware=middleware, exception_handlers={HTTPException: _refused})
    # No path is answered with a redirect to another: Starlette would send `/media/0%2F` (a slash encoded in
    # a stranger's segment, decoded by the router) to `/media/0`. A path no route takes is a 404 that says so.
    app.router.redirect_slashes = False
    app.state.store = store
    app.state.endpoint = endpoint
    app.state.templates = _templates()
    app.state.sql_slots = sql_slots
    app.state.token = secret
    return app
