"""The recorder's token in front of every page, API call and blob, as the gRPC port has it (`daemon/auth.py`).

A script sends `Authorization: Bearer <token>`; a person signs in once on `/login`, which keeps the token in an
HttpOnly, SameSite=Strict cookie (Secure over TLS): script on a page cannot read it and another site cannot send
it. The token is compared in constant time and never logged or echoed. Static files (the style sheet and the
script) are open: they hold nothing recorded.
"""

from __future__ import annotations

import hmac
from urllib.parse import parse_qs, quote

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "steprec_token"
_OPEN_PATHS = ("/login", "/static/")
MAX_FORM_BYTES = 8192


class Token:
    """The recorder's secret, compared in constant time."""

    def __init__(self, secret: str) -> None:
        self._expected = secret.encode()

    def matches(self, supplied: str) -> bool:
        return bool(supplied) and hmac.compare_digest(supplied.encode(), self._expected)

    def admits(self, request: Request) -> bool:
        """The token in the `Authorization` header, or else in the sign-in cookie."""
        header = request.headers.get("authorization", "")
        return self.matches(
            header[len("Bearer ") :] if header.startswith("Bearer ") else request.cookies.get(COOKIE, "")
        )


class TokenGate:
    """Lets a request through only with the token; sends a person to sign in and a script a 401."""

    def __init__(self, app: ASGIApp, token: Token) -> None:
        self.app = app
        self._token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(_OPEN_PATHS) or self._token.admits(Request(scope)):
            await self.app(scope, receive, send)
            return
        await self._refusal(scope)(scope, receive, send)

    @staticmethod
    def _refusal(scope: Scope) -> Response:
        path = scope["path"]
        if path.startswith(("/api/", "/media/")) or scope["method"] not in ("GET", "HEAD"):
            return JSONResponse({"error": "this recorder requires its token: 'Authorization: Bearer <token>'"}, 401)
        query = scope.get("query_string", b"").decode("latin-1")
        target = path + (f"?{query}" if query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path on this site only (never `//elsewhere` or `https://...`)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


async def submitted_form(request: Request) -> dict[str, str]:
    """A small urlencoded form's fields (one value each); a body past `MAX_FORM_BYTES` is refused."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise ValueError(f"the form is larger than {MAX_FORM_BYTES} bytes")
    fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=8)
    return {name: values[0] for name, values in fields.items()}


def signed_in(target: str, token: str, *, secure: bool) -> Response:
    response = RedirectResponse(safe_next(target), status_code=303)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=secure, path="/")
    return response


def signed_out() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response
