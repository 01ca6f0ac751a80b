"""A snapshot's messages, as stored, turned into transcript entries a template shows.

The input is pydantic-ai's message JSON as the store holds it: media as markers naming a blob
(`store/media.py`), so an image is a link to `/media/<sha256>` rather than its base64 inlined into the page.
Every field stays data: the template escapes it. Parts this module does not know are shown as their JSON, so
a newer pydantic-ai part is never dropped from view.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..store.media import LITERAL, MARKER, URI_PREFIX

ROLES = {
    "system-prompt": "system",
    "user-prompt": "user",
    "tool-return": "tool return",
    "builtin-tool-return": "tool return",
    "retry-prompt": "retry",
    "text": "model",
    "tool-call": "tool call",
    "builtin-tool-call": "tool call",
    "thinking": "thinking",
    "file": "model file",
}
_INLINE_KINDS = ("image/", "audio/", "video/")
_URL_KINDS = ("image-url", "audio-url", "video-url", "document-url")


def shown_as(media_type: str) -> str:
    """`image`, `audio`, `video`, or `link` (anything else, SVG included: a page never embeds active content)."""
    if media_type == "image/svg+xml" or not media_type.startswith(_INLINE_KINDS):
        return "link"
    return media_type.split("/", 1)[0]


@dataclass(frozen=True)
class Media:
    """A blob a part refers to: where the page fetches it, what it is, and how the page shows it."""

    href: str
    media_type: str
    size_note: str = ""
    shown_as: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shown_as", shown_as(self.media_type))


@dataclass(frozen=True)
class Entry:
    """One part of one message: who said it, and its text, JSON or media."""

    message_index: int
    role: str
    kind: str
    text: str = ""
    json: str = ""
    tool_name: str = ""
    tool_call_id: str = ""
    media: tuple[Media, ...] = field(default=())


def entries(messages: list[str], *, first_index: int = 0) -> list[Entry]:
    """The transcript of `messages` (stored JSON texts), each entry numbered by its message's place in the
    snapshot (`first_index` for the first one given)."""
    shown: list[Entry] = []
    for offset, text in enumerate(messages):
        message = _unwrapped(json.loads(text))
        parts = message.get("parts") if isinstance(message, dict) else None
        index = first_index + offset
        if not isinstance(parts, list):
            shown.append(Entry(index, "message", "unknown", json=_pretty(message)))
            continue
        if isinstance(message.get("instructions"), str) and message["instructions"]:
            shown.append(Entry(index, "system", "instructions", text=message["instructions"]))
        shown.extend(_part(index, part) for part in parts if isinstance(part, dict))
    return shown


def _part(index: int, part: dict) -> Entry:
    kind = part.get("part_kind") if isinstance(part.get("part_kind"), str) else "unknown"
    role = ROLES.get(kind, kind)
    tool = {"tool_name": _text(part.get("tool_name")), "tool_call_id": _text(part.get("tool_call_id"))}
    if kind in ("tool-call", "builtin-tool-call"):
        return Entry(index, role, kind, json=_arguments(part.get("args")), **tool)
    content = part.get("content")
    media = tuple(_media_in(part))
    if isinstance(content, str):
        return Entry(index, role, kind, text=content, media=media, **tool)
    if kind == "user-prompt" and isinstance(content, list):
        texts = [item for item in content if isinstance(item, str)]
        texts += [item["content"] for item in content if _is_text_content(item)]
        return Entry(index, role, kind, text="\n\n".join(texts), media=media, **tool)
    if content is None and media:
        return Entry(index, role, kind, media=media, **tool)
    return Entry(index, role, kind, json=_pretty(_without_markers(content)), media=media, **tool)


def _media_in(node: object) -> list[Media]:
    """Every blob marker and media URL inside a part, in order."""
    if isinstance(node, list):
        return [media for item in node for media in _media_in(item)]
    if not isinstance(node, dict):
        return []
    marker = node.get(MARKER)
    if isinstance(marker, dict) and isinstance(marker.get("uri"), str) and marker["uri"].startswith(URI_PREFIX):
        href = "/media/" + marker["uri"][len(URI_PREFIX) :]
        if marker.get("field") == "content":
            return [Media(href, "text/plain", "the full text, stored apart for its size")]
        return [Media(href, _text(node.get("media_type")) or "application/octet-stream")]
    url = node.get("url")
    if node.get("kind") in _URL_KINDS and isinstance(url, str) and url.startswith(("https://", "http://")):
        # A link, never embedded: the page loads nothing from elsewhere (its policy would refuse it anyway).
        return [Media(url, node["kind"], "an address the model was given")]
    return [media for value in node.values() for media in _media_in(value)]


def _is_text_content(item: object) -> bool:
    return isinstance(item, dict) and item.get("kind") == "text-content" and isinstance(item.get("content"), str)


def _unwrapped(node: object) -> object:
    """Caller data the store wrapped because it spelled a marker key (`LITERAL`), as the caller sent it."""
    if isinstance(node, list):
        return [_unwrapped(item) for item in node]
    if not isinstance(node, dict):
        return node
    if LITERAL in node and len(node) == 1 and isinstance(node[LITERAL], dict):
        node = node[LITERAL]
    return {key: _unwrapped(value) for key, value in node.items()}


def _without_markers(node: object) -> object:
    if isinstance(node, list):
        return [_without_markers(item) for item in node]
    if isinstance(node, dict):
        return {key: _without_markers(value) for key, value in node.items() if key != MARKER}
    return node


def _arguments(args: object) -> str:
    """Tool-call arguments as indented JSON; a string the model sent that is not JSON, as it came."""
    if isinstance(args, str):
        try:
            return _pretty(json.loads(args))
        except ValueError:
            return args
    return _pretty(args)


def _pretty(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
