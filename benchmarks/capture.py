"""Real agent traffic, captured on the wire and made replayable under fresh run ids.

Real `StepRecorder` runs (a 5-step run; a 50-step run with 2 KB tool returns; a run continued from
another with `continue_run`; a fork; an orchestrator with a delegate) send to a small gRPC proxy
that keeps each Export request's bytes exactly as the exporter sent them and forwards them to a
real recorder (so the runs' own registrations are answered and `continue_run` reads a real store).

Each captured run id is then renamed to a template id that starts with `PLACEHOLDER`, in record
attributes and body metadata only (message bodies are content-addressed and stay byte for byte
as sent), so one `bytes.replace` of that fixed-length placeholder gives every run of a replay a
fresh, unique id without decoding anything: replays can be made as fast as a sender sends them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from steprec.proto import wire

from benchmarks.common import payloads

SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
EXPORT = f"/{SERVICE}/Export"
PLACEHOLDER = b"zqzqzqzq"
"""Eight bytes no captured id or attribute holds; a replay replaces them with its own eight."""
COPY_SLOT = PLACEHOLDER + b"-0000-"
"""Where a template id says which copy of a batched block its run belongs to."""
THINK_SECONDS = 0.06
"""Each model request's latency while capturing: longer than the exporter's 50 ms linger, as a real model's is."""
RUN_ID_ATTRIBUTES = (wire.RUN_ID, wire.PARENT_RUN_ID, wire.FORKED_FROM_RUN_ID)


@dataclass(frozen=True)
class Capture:
    """The Export requests real runs sent, in order, with every run id a template id."""

    requests: list[bytes]
    runs: list[str]
    """The template run ids, in the order their runs started."""

    @property
    def records(self) -> int:
        return sum(len(_records(request)) for request in self.requests)

    def replay(self, prefix: bytes) -> list[bytes]:
        """The requests with every run renamed by the eight-byte `prefix`."""
        assert len(prefix) == len(PLACEHOLDER)
        return [request.replace(PLACEHOLDER, prefix) for request in self.requests]

    def batched(self, replays: int, records_per_request: int) -> list[bytes]:
        """`replays` copies of the capture's records, run ids made distinct per copy (the prefix is still to
        be replaced), in send order, packed `records_per_request` to a request: one block of batched load."""
        parsed = [ExportLogsServiceRequest.FromString(request) for request in self.requests]
        first = parsed[0].resource_logs[0]
        records: list[LogRecord] = []
        for copy in range(replays):
            slot = COPY_SLOT.replace(b"0000", b"%04x" % copy)
            for request in self.requests:
                records.extend(_records(request.replace(COPY_SLOT, slot)))
        out = []
        for start in range(0, len(records), records_per_request):
            chunk = records[start : start + records_per_request]
            out.append(
                ExportLogsServiceRequest(
                    resource_logs=[
                        ResourceLogs(
                            resource=first.resource,
                            scope_logs=[ScopeLogs(scope=first.scope_logs[0].scope, log_records=chunk)],
                        )  # fmt: skip
                    ]
                ).SerializeToString()
            )
        return out

    def replayed_runs(self, prefix: bytes) -> list[str]:
        return [run.replace(PLACEHOLDER.decode(), prefix.decode()) for run in self.runs]


def _records(request: bytes) -> list[LogRecord]:
    parsed = ExportLogsServiceRequest.FromString(request)
    return [record for rl in parsed.resource_logs for sl in rl.scope_logs for record in sl.log_records]


class _CapturingProxy:
    """An OTLP logs endpoint that keeps each Export's bytes and forwards them unchanged to `upstream`."""

    def __init__(self, upstream: str) -> None:
        self.requests: list[bytes] = []
        self._lock = threading.Lock()
        self._channel = grpc.insecure_channel(upstream)
        self._forward = self._channel.unary_unary(EXPORT)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(self._export)}
        )
        self._server.add_generic_rpc_handlers([handler])
        self.endpoint = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"

    def _export(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        answer = self._forward(request, timeout=60)
        with self._lock:
            self.requests.append(request)
        return answer

    def __enter__(self) -> _CapturingProxy:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(None)
        self._channel.close()


async def _run_scenarios(proxy: str, recorder: str) -> None:
    """The five kinds of run, one after the other, each delivered before the next starts."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.usage import UsageLimits
    from steprec.exporter import StepRecorder
    from steprec.query import RecorderClient, continue_run, fork_run

    from benchmarks.common import agent, settle

    def recorded(tool_returns: list[str]):
        return agent(tool_returns, [StepRecorder(endpoint=proxy)], think_seconds=THINK_SECONDS)

    await recorded([p[:100] for p in payloads(5)]).run("go")  # five steps, short returns
    await recorded(payloads(50)).run("go", usage_limits=UsageLimits(request_limit=None))  # fifty steps, 2 KB returns
    await settle(recorder)
    async with RecorderClient(recorder) as client:
        five, fifty = (await client.list_runs())[:2]
        history = await continue_run(client, run_id=five.run_id)
        await recorded(payloads(3)).run("and again", message_history=history)
        forked = await fork_run(client, run_id=fifty.run_id)
        await recorded(payloads(2)).run("fork", message_history=forked, metadata=forked.metadata)
    delegate = Agent(
        FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("delegated answer")])),
        name="delegate",
        capabilities=[StepRecorder(endpoint=proxy, agent_name="delegate")],
    )
    orchestrator = Agent(
        FunctionModel(
            lambda m, i: (
                ModelResponse(parts=[ToolCallPart("ask", {"q": "x"})])
                if len(m) < 3
                else ModelResponse(parts=[TextPart("orchestrated")])
            )
        ),
        name="orchestrator",
        capabilities=[StepRecorder(endpoint=proxy, agent_name="orchestrator")],
    )

    @orchestrator.tool_plain
    async def ask(q: str) -> str:
        return (await delegate.run(q)).output

    await orchestrator.run("orchestrate")
    await settle(recorder)


def capture(recorder_endpoint: str) -> Capture:
    """Run the scenarios through a capturing proxy in front of the recorder at `recorder_endpoint`."""
    from steprec.exporter import shutdown_pipelines

    with _CapturingProxy(recorder_endpoint) as proxy:
        asyncio.run(_run_scenarios(proxy.endpoint, recorder_endpoint))
        shutdown_pipelines()
        requests = list(proxy.requests)
    return templated(requests)


def templated(requests: Iterable[bytes]) -> Capture:
    """The requests with each run id (in the order first seen) renamed `<PLACEHOLDER>-0000-<n>`."""
    names: dict[str, str] = {}
    out = []
    for raw in requests:
        request = ExportLogsServiceRequest.FromString(raw)
        for record in _iter_records(request):
            for attribute in record.attributes:
                if attribute.key in RUN_ID_ATTRIBUTES:
                    attribute.value.string_value = _renamed(names, attribute.value.string_value)
            for entry in record.body.kvlist_value.values:
                if entry.key == wire.BODY_METADATA:
                    _rename_values(entry.value, names)
        out.append(request.SerializeToString())
    return Capture(requests=out, runs=list(names.values()))


def _iter_records(request: ExportLogsServiceRequest) -> Iterator[LogRecord]:
    for rl in request.resource_logs:
        for sl in rl.scope_logs:
            yield from sl.log_records


def _rename_values(value: AnyValue, names: dict[str, str]) -> None:
    for entry in value.kvlist_value.values:
        if entry.value.string_value in names:
            entry.value.string_value = names[entry.value.string_value]


def _renamed(names: dict[str, str], run_id: str) -> str:
    if run_id not in names:
        names[run_id] = f"{COPY_SLOT.decode()}{len(names):06d}"
    return names[run_id]


def save(found: Capture, folder: Path) -> None:
    """Keep a capture as files (for replaying from another process)."""
    folder.mkdir(parents=True, exist_ok=True)
    for number, request in enumerate(found.requests):
        (folder / f"{number:06d}.bin").write_bytes(request)
    (folder / "runs.txt").write_text("\n".join(found.runs))


def load(folder: Path) -> Capture:
    requests = [path.read_bytes() for path in sorted(folder.glob("*.bin"))]
    return Capture(requests=requests, runs=(folder / "runs.txt").read_text().split("\n"))
