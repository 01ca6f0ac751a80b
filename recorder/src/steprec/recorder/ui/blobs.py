"""`/media/<sha256>`: a blob a stored message refers to, with the media type that message gives it.

Images, audio and video are shown in the page and plain text in the browser; anything else, SVG included
(it can carry script), is sent as an attachment. Every blob response forbids sniffing and is sandboxed by its
own Content-Security-Policy, so even a blob opened directly cannot run anything on this origin.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from ..store.media import URI_PREFIX, MediaCorrupt
from .params import NotFound, Params, sha256
from .transcript import shown_as

BLOB_POLICY = "sandbox; default-src 'none'; img-src 'self'; media-src 'self'; style-src 'unsafe-inline'"


async def blob(request: Request) -> Response:
    Params(request.query_params, ())
    digest = sha256(request.path_params["sha256"])
    uri = URI_PREFIX + digest
    store = request.app.state.store

    def read() -> tuple[str, bytes] | None:
        media_type = store.media_type(uri)
        return None if media_type is None else (media_type, store.read_media(uri))

    try:
        found = await asyncio.to_thread(read)
    except (OSError, MediaCorrupt) as error:
        return Response(f"{uri} cannot be read: {error}", status_code=500, media_type="text/plain")
    if found is None or found[1] is None:
        raise NotFound(f"no stored message refers to {uri}")
    media_type, data = found
    headers = {"Content-Security-Policy": BLOB_POLICY, "Cache-Control": "private, max-age=31536000, immutable"}
    if shown_as(media_type) == "link" and not media_type.startswith("text/plain"):
        headers["Content-Disposition"] = f'attachment; filename="{digest[:16]}"'
    return Response(data, media_type=media_type, headers=headers)
