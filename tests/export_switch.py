"""A gRPC hop in front of recorders that a test moves from one to another: what a load balancer does to an agent
whose connection is opened again elsewhere. It forwards each OTLP Export's bytes unchanged to the recorder it
points at now, and passes the answer back, or loses it (the request reached the recorder, the answer did not
reach the agent: the agent sends it again, wherever the hop points next)."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent import futures

import grpc

EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


class ExportSwitch:
    def __init__(self, target: str) -> None:
        self._lock = threading.Lock()
        self._target = target
        self._lose_next = False
        self._channels: dict[str, grpc.Channel] = {}
        self.answered: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.refusals: list[str] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.unary_unary_rpc_method_handler(self._export)
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.logs.v1.LogsService", {"Export": handler})])  # fmt: skip
        self.endpoint = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def send_to(self, target: str, *, lose_next_answer: bool = False) -> None:
        """Point at `target` from now on; with `lose_next_answer` the next Export still goes where it pointed, and
        its answer is lost."""
        with self._lock:
            if lose_next_answer:
                self._lose_next, self._after_loss = True, target
            else:
                self._target = target

    def _export(self, payload: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            target, lose = self._target, self._lose_next
            if lose:
                self._lose_next, self._target = False, self._after_loss
            channel = self._channels.get(target) or self._channels.setdefault(target, grpc.insecure_channel(target))
        try:
            answer = channel.unary_unary(EXPORT)(payload, timeout=10)
        except grpc.RpcError as error:
            with self._lock:
                self.refused[target] += 1
                self.refusals.append(f"{target}: {error.details()}")
            context.abort(error.code(), error.details())
        with self._lock:
            self.answered[target] += 1
        if lose:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the connection broke before the answer came back")
        return answer

    def close(self) -> None:
        self._server.stop(grace=None)
        for channel in self._channels.values():
            channel.close()

    def __enter__(self) -> ExportSwitch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
