"""The steprec.admin.v1 RecorderAdmin service: store maintenance over gRPC."""

from __future__ import annotations

import asyncio

import grpc
from steprec.proto.admin.v1 import admin_pb2 as pb
from steprec.proto.admin.v1 import admin_pb2_grpc

from ..store.applier import StoreUnavailable
from ..store.duckdb_store import DuckDBStore


class RecorderAdmin(admin_pb2_grpc.RecorderAdminServicer):
    def __init__(self, store: DuckDBStore) -> None:
        self._store = store

    async def Prune(self, request: pb.PruneRequest, context: grpc.aio.ServicerContext) -> pb.PruneResponse:  # noqa: N802
        try:
            result = await asyncio.to_thread(
                self._store.prune,
                started_before_ns=request.started_before_unix_nano
                if request.HasField("started_before_unix_nano")
                else None,
                conversation_id=request.conversation_id if request.HasField("conversation_id") else None,
                dry_run=request.dry_run,
            )
        except ValueError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except StoreUnavailable as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{error}; nothing was pruned, retry later")
        return pb.PruneResponse(**vars(result))
