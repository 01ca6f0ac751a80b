"""`steprec conversations | conversation`: the recorder's conversation heads from a shell (docs/conversations.md)."""

from __future__ import annotations

import argparse

from pydantic_ai.messages import ModelMessagesTypeAdapter

from .client import RecorderClient
from .commands import add_client_command
from .conversations import ConversationStore
from .read_commands import _plain, _print_json, _table


async def _conversations(client: RecorderClient, options: argparse.Namespace) -> int:
    archived = None if options.all else options.archived
    summaries = await ConversationStore(client).listing(query=options.search or "", limit=options.limit,
                                                        offset=options.offset, archived=archived)  # fmt: skip
    if options.json:
        _print_json(_plain(summaries))
        return 0
    rows = [[s.updated_at.isoformat(timespec="seconds"), s.id, s.title, s.outcome, s.message_count, s.workspace,
             ", ".join(s.tags), "archived" if s.archived_at else ""] for s in summaries]  # fmt: skip
    _table(f"{len(summaries)} conversations",
           ["active", "conversation", "title", "outcome", "messages", "workspace", "tags", ""], rows)  # fmt: skip
    return 0


async def _conversation(client: RecorderClient, options: argparse.Namespace) -> int:
    saved = await ConversationStore(client).get(conversation_id=options.conversation_id)
    messages = ModelMessagesTypeAdapter.dump_python(saved.messages, mode="json")
    if options.json:
        _print_json({"summary": _plain(saved.summary), "messages": messages})
        return 0
    summary = _plain(saved.summary)
    runs = await client.list_runs(conversation_id=saved.summary.id)
    rows = [[key, value] for key, value in summary.items()] + [["runs", ", ".join(r.run_id for r in runs)]]
    _table(f"conversation {saved.summary.id}", ["field", "value"], rows)
    return 0


def _page_size(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 10_000:
        raise argparse.ArgumentTypeError(f"{value!r} is not a page size from 1 to 10000")
    return int(value)


def _offset(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a nonnegative number")
    return int(value)


def register(commands: argparse._SubParsersAction) -> None:
    listing = add_client_command(commands, "conversations", "list conversation heads, most recently active first",
                                 _conversations)  # fmt: skip
    listing.add_argument("--search", metavar="TEXT", help="match user and assistant text, title, tags and metadata "
                         "(Unicode case-folded)")  # fmt: skip
    shown = listing.add_mutually_exclusive_group()
    shown.add_argument("--archived", action="store_true", help="only archived conversations (default: those not)")
    shown.add_argument("--all", action="store_true", help="archived conversations and the others")
    listing.add_argument("--limit", type=_page_size, default=200, metavar="N", help="at most N (default 200)")
    listing.add_argument("--offset", type=_offset, default=0, metavar="N", help="skip the first N")
    one = add_client_command(commands, "conversation", "a conversation head: its summary and runs (--json: and its "
                             "messages)", _conversation)  # fmt: skip
    one.add_argument("conversation_id", metavar="ID", help="the conversation id")
