"""Media offload: `BinaryContent` and large text parts live as content-addressed blobs, not in DuckDB rows.

A stored message keeps a small marker where the payload was; reads put the
payload back, so what a reader gets is the message the agent sent. Blobs are
named by SHA-256 (`media+sha256://<hex>`), written once (a second writer of the
same bytes finds the file there), atomically (temporary file, then rename) and
owner-only. What counts as large follows pydantic-ai-harness: every
`BinaryContent`, and every string part of 64 KiB or more by default.

The walker works on the JSON tree and recognises the shapes pydantic-ai
serialises: `{"kind": "binary", "data": <base64>}` and a string `content` next to
a `part_kind` (every message part) or `"kind": "text-content"`. Caller data
that happens to contain the marker key is wrapped on the way in and unwrapped
on the way out, so it can never be mistaken for a marker.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Protocol

URI_PREFIX = "media+sha256://"
MARKER = "__steprec_media__"
LITERAL = "__steprec_literal__"
DEFAULT_THRESHOLD = 64 * 1024
_TEXT_KINDS = ("text-content", "structured-content")
_URI = re.compile(r"media\+sha256://([0-9a-f]{64})")


class MediaCorrupt(RuntimeError):
    """A blob whose bytes no longer hash to the digest in its name."""


def is_media_uri(text: str) -> bool:
    return _URI.fullmatch(text) is not None


class MediaStore(Protocol):
    """Where blobs live: `put` returns the blob's URI, `get` its bytes, `collect_garbage` prunes."""

    def put(self, data: bytes) -> str: ...

    def get(self, uri: str) -> bytes: ...

    def collect_garbage(self, referenced: set[str]) -> tuple[int, int]: ...


def _hex_of(uri: str) -> str:
    match = _URI.fullmatch(uri)
    if match is None:
        raise ValueError(f"{uri[:100]!r} is not a media+sha256:// URI")
    return match[1]


class LocalMediaStore:
    """Blobs on local disk under `<data>/media/<first two hex digits>/<hex>`."""

    def __init__(self, folder: Path, *, fsync: bool = False) -> None:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.folder = folder
        self.fsync = fsync

    def _path(self, hex_digest: str) -> Path:
        return self.folder / hex_digest[:2] / hex_digest

    def put(self, data: bytes) -> str:
        hex_digest = hashlib.sha256(data).hexdigest()
        path = self._path(hex_digest)
        if not path.exists():
            path.parent.mkdir(exist_ok=True, mode=0o700)
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
                tmp.write(data)
                if self.fsync:
                    tmp.flush()
                    os.fsync(tmp.fileno())
            os.chmod(tmp.name, 0o600)
            os.replace(tmp.name, path)
        return URI_PREFIX + hex_digest

    def get(self, uri: str) -> bytes:
        return self._path(_hex_of(uri)).read_bytes()

    def collect_garbage(self, referenced: set[str]) -> tuple[int, int]:
        """Delete blobs whose URI is not in `referenced`; returns (count, bytes) removed."""
        count = size = 0
        for path in self.folder.glob("??/*"):
            if URI_PREFIX + path.name not in referenced and len(path.name) == 64:
                size += path.stat().st_size
                path.unlink()
                count += 1
        return count, size


class S3MediaStore:
    """Blobs in an S3-compatible bucket as `<prefix>/<hex>`; a PUT is atomic, so no temporary object."""

    def __init__(self, url: str, *, endpoint_url: str | None = None, region: str | None = None,
                 access_key_id: str | None = None, secret_access_key: str | None = None) -> None:  # fmt: skip
        import boto3  # only a recorder that uses S3 pays for importing it

        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise ValueError(f"{url!r} names no bucket; expected s3://bucket/prefix")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self._s3 = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
        )
        self._s3.head_bucket(Bucket=bucket)  # fail at start, with the reason, not at the first image

    def _key(self, hex_digest: str) -> str:
        return f"{self.prefix}/{hex_digest}" if self.prefix else hex_digest

    def put(self, data: bytes) -> str:
        hex_digest = hashlib.sha256(data).hexdigest()
        key = self._key(hex_digest)
        try:
            self._s3.head_object(Bucket=self.bucket, Key=key)
        except self._s3.exceptions.ClientError:
            self._s3.put_object(Bucket=self.bucket, Key=key, Body=data)
        return URI_PREFIX + hex_digest

    def get(self, uri: str) -> bytes:
        return self._s3.get_object(Bucket=self.bucket, Key=self._key(_hex_of(uri)))["Body"].read()

    def collect_garbage(self, referenced: set[str]) -> tuple[int, int]:
        count = size = 0
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}/" if self.prefix else ""
        )
        for page in pages:
            doomed = [
                item for item in page.get("Contents", [])
                if _URI.fullmatch(URI_PREFIX + item["Key"].rsplit("/", 1)[-1])
                and URI_PREFIX + item["Key"].rsplit("/", 1)[-1] not in referenced
            ]  # fmt: skip
            if doomed:
                self._s3.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": i["Key"]} for i in doomed]})
                count += len(doomed)
                size += sum(item["Size"] for item in doomed)
        return count, size


def open_media_store(location: str | None, data_dir: Path, *, fsync: bool, **s3_options: str | None) -> MediaStore:
    """`s3://bucket/prefix` for S3-compatible storage, a folder path, or None for `<data>/media`."""
    if location and location.startswith("s3://"):
        return S3MediaStore(location, **s3_options)
    return LocalMediaStore(Path(location) if location else data_dir / "media", fsync=fsync)


def _decode_base64(data: str) -> tuple[bytes, str] | None:
    urlsafe = "-" in data or "_" in data
    if urlsafe and ("+" in data or "/" in data):
        return None
    try:
        raw = base64.b64decode(data, altchars=b"-_" if urlsafe else None, validate=True)
    except ValueError:
        return None
    return raw, ("url" if urlsafe else "std") + ("" if data.endswith("=") or len(data) % 4 == 0 else "-nopad")


def _encode_base64(raw: bytes, encoding: str) -> str:
    alphabet, _, padding = encoding.partition("-")
    text = (base64.urlsafe_b64encode if alphabet == "url" else base64.b64encode)(raw).decode()
    return text.rstrip("=") if padding == "nopad" else text


def _json_text(tree: object) -> str:
    """Compact JSON, as UTF-8 text where it can be: a message may spell a lone surrogate (`"\\ud800"` is
    valid JSON, not valid Unicode), which only ASCII escapes can carry into the store and back out."""
    text = json.dumps(tree, separators=(",", ":"), ensure_ascii=False)
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(tree, separators=(",", ":"))
    return text


class MediaCodec:
    """Moves payloads out of message JSON into a MediaStore, and back."""

    def __init__(self, store: MediaStore, *, threshold: int = DEFAULT_THRESHOLD) -> None:
        self.store = store
        self.threshold = threshold

    def externalize(self, text: str) -> tuple[str, list[tuple[str, int]]]:
        """The message JSON with its payloads replaced by markers, and the `(uri, bytes)` it now refers to."""
        if '"binary"' not in text and len(text) < self.threshold and MARKER not in text and LITERAL not in text:
            return text, []
        offloaded: list[tuple[str, int]] = []
        tree = self._out(json.loads(text), offloaded)
        return _json_text(tree), offloaded

    def restore(self, text: str) -> str:
        if MARKER not in text and LITERAL not in text:
            return text
        return _json_text(self._in(json.loads(text)))

    def _out(self, node: object, offloaded: list[tuple[str, int]]) -> object:
        if isinstance(node, list):
            return [self._out(item, offloaded) for item in node]
        if not isinstance(node, dict):
            return node
        if MARKER in node or LITERAL in node:
            return {LITERAL: {key: self._out(value, offloaded) for key, value in node.items()}}
        data = node.get("data")
        if node.get("kind") == "binary" and isinstance(data, str) and (decoded := _decode_base64(data)):
            raw, encoding = decoded
            return self._marked(node, "data", raw, encoding, offloaded)
        content = node.get("content")
        is_part = isinstance(node.get("part_kind"), str) or node.get("kind") in _TEXT_KINDS
        if is_part and isinstance(content, str) and len(content.encode()) >= self.threshold:
            return self._marked(node, "content", content.encode(), "utf-8", offloaded)
        return {key: self._out(value, offloaded) for key, value in node.items()}

    def _marked(self, node: dict, field: str, payload: bytes, encoding: str, offloaded: list[tuple[str, int]]) -> dict:
        uri = self.store.put(payload)
        offloaded.append((uri, len(payload)))
        rest = {key: self._out(value, offloaded) for key, value in node.items() if key != field}
        return {**rest, MARKER: {"field": field, "uri": uri, "encoding": encoding}}

    def _in(self, node: object) -> object:
        if isinstance(node, list):
            return [self._in(item) for item in node]
        if not isinstance(node, dict):
            return node
        if LITERAL in node and len(node) == 1:
            return {key: self._in(value) for key, value in node[LITERAL].items()}
        marker = node.get(MARKER)
        restored = {key: self._in(value) for key, value in node.items() if key != MARKER}
        if isinstance(marker, dict):
            raw = self.store.get(marker["uri"])
            encoding = marker["encoding"]
            restored[marker["field"]] = raw.decode() if encoding == "utf-8" else _encode_base64(raw, encoding)
        return restored
