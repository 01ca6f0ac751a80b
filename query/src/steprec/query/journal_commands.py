"""`steprec journal status [DIR]` and `steprec journal push [DIR]`: a person looking at, and delivering by hand,
the journals agents left behind (docs/delivery.md)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from steprec.proto import journal
from steprec.proto.tls import ClientTLS

from .commands import add_connection_arguments, read_token

_EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
_BATCH_BYTES = 2 << 20


def _folder(options: argparse.Namespace) -> Path:
    folder = options.dir or journal.default_journal_dir(options.endpoint)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a journal folder (no such folder)")
    return folder


def _status(options: argparse.Namespace) -> int:
    folder = _folder(options)
    found = journal.status(folder)
    if options.json:
        print(json.dumps([{**vars(s), "path": str(s.path)} for s in found]))
        return 0
    for s in found:
        owner = "alive" if s.owner_alive else "dead"
        frames = "?" if s.owner_alive else str(s.unsent_frames)
        torn = f", {s.torn_bytes:,} torn bytes" if s.torn_bytes else ""
        unsent = f"{s.unsent_bytes:,} unsent in {frames} frames{torn}"
        print(f"{s.path.name}  owner {owner}  {s.size_bytes:,} bytes, {unsent}")
    dead = [s for s in found if not s.owner_alive]
    print(f"{len(found)} segment(s) in {folder}: {len(dead)} of dead processes, "
          f"{sum(s.unsent_bytes for s in dead):,} bytes to deliver")  # fmt: skip
    return 0


def _export(options: argparse.Namespace) -> grpc.UnaryUnaryMultiCallable:
    target = re.sub(r"^https?://", "", options.endpoint).rstrip("/")
    tls = ClientTLS(options.tls_ca, options.tls_cert, options.tls_key)
    if options.endpoint.startswith("https://") or tls.configured:
        channel = grpc.secure_channel(target, tls.credentials())
    else:
        channel = grpc.insecure_channel(target)
    return channel.unary_unary(_EXPORT, response_deserializer=ExportLogsServiceResponse.FromString)


def _push(options: argparse.Namespace) -> int:
    folder = _folder(options)
    token = read_token(options)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    export = _export(options)
    segments = journal.orphans(folder)
    live = len(list(folder.glob(journal.SEGMENT_GLOB))) - len(segments)
    frames = refused = 0
    for segment in segments:
        try:
            while segment.ends:
                end, payloads, _ = segment.oldest_requests(_BATCH_BYTES)
                if not payloads:  # the next frame is not an OTLP request
                    break
                try:
                    response = export(b"".join(payloads), metadata=metadata, timeout=30)
                except grpc.RpcError as error:
                    if error.code() == grpc.StatusCode.UNAUTHENTICATED:
                        raise PermissionError(f"the recorder refused the token: {error.details()}") from None
                    why = f"the recorder at {options.endpoint} did not take it: {error.details()}"
                    raise ConnectionError(why) from None
                if response.partial_success.rejected_log_records:
                    refused += response.partial_success.rejected_log_records
                    print(f"{segment.path.name}: refused {response.partial_success.error_message}")
                segment.advance(end)
                frames += len(payloads)
            if segment.ends:
                print(f"{segment.path.name}: the frame at byte {segment.position:,} is not an OTLP request; set aside "
                      f"as {segment.set_aside()}")  # fmt: skip
            elif segment.torn_bytes:
                print(f"{segment.path.name}: {segment.torn_bytes:,} torn bytes after its last intact frame; set aside "
                      f"as {segment.set_aside()}")  # fmt: skip
            else:
                segment.remove()
        finally:
            segment.release()
    print(f"pushed {frames} frame(s) of {len(segments)} segment(s) to {options.endpoint}; {refused} record(s) "
          f"refused; {live} segment(s) of live processes left alone")  # fmt: skip
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    what = "The journals StepRecorder writes before sending (docs/delivery.md)."
    parser = commands.add_parser("journal", help="look at and deliver agents' journals", description=what)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, run, what in (
        ("status", _status, "list the segments of a journal folder: owner alive or dead, bytes not yet delivered"),
        ("push", _push, "send the segments of dead processes to a recorder, in order, and remove them"),
    ):
        action = actions.add_parser(name, help=what, description=what)
        action.add_argument("dir", nargs="?", type=Path, default=None, metavar="DIR",
                            help="the journal folder (default: the endpoint's default journal folder)")  # fmt: skip
        add_connection_arguments(action)
        action.set_defaults(run=run)
