"""StepRecorder: the step-persistence capability, recording to a steprec recorder over OTLP."""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from pydantic_ai import CallToolsNode, ModelRequestNode
from pydantic_ai.capabilities import AbstractCapability, durable_operation
from pydantic_ai.capabilities.abstract import AgentNode, NodeResult, WrapRunHandler, WrapToolExecuteHandler
from pydantic_ai.exceptions import ModelRetry, ToolFailed, ToolFailedError, ToolRetryError
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT, RunContext, ToolDefinition
from steprec.proto import wire
from steprec.proto.journal import check_journal_dir, default_journal_dir
from steprec.proto.tls import ClientTLS

from . import _records
from ._context import active_recording, live_history
from ._delivery import Delivery, OrderedDeliveryProcessor
from ._events import SnapshotSaved
from ._history import has_model_response
from ._identity import check_run_id, derive_run_id
from ._pipeline import DeliveryOptions, pipeline_for
from ._records import ErrorText, Record
from ._snapshots import Keyed, SnapshotEncoder

DEFAULT_ENDPOINT = "127.0.0.1:4317"
_RESEND_WHOLE = {"refused:unknown_message", "refused:unknown_base"}
_DELIVERY_MODES = ("journal", "acknowledged", "best_effort")
_MIN_JOURNAL_BYTES = 1 << 20
_RETRIED_OR_FAILED = (ModelRetry, ToolFailed, ToolRetryError, ToolFailedError)
"""Raised by a tool to ask the model to try again, or to report failure: pydantic-ai calls no error hook
for them, so `wrap_tool_execute` records the call's end."""
_UNKNOWN = object()
_ENDPOINT = re.compile(r"^(?:https?://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):\d{1,5}/?$")


def _check_endpoint(endpoint: str) -> str:
    if not isinstance(endpoint, str) or not _ENDPOINT.match(endpoint):
        raise ValueError(f"endpoint {endpoint!r} must look like host:port or http://host:port")
    port = int(endpoint.rstrip("/").rsplit(":", 1)[1])
    if not 0 < port < 65536:
        raise ValueError(f"endpoint {endpoint!r} has port {port}, outside 1-65535")
    return endpoint


def _fork_origin(run_metadata: Mapping[str, Any] | None) -> tuple[str, int] | None:
    """Where a fork's history came from, if `Agent.run(metadata=...)` says (see `ForkedHistory`)."""
    if not run_metadata or wire.FORKED_FROM_RUN_ID not in run_metadata:
        return None
    run_id = check_run_id(run_metadata[wire.FORKED_FROM_RUN_ID], what=wire.FORKED_FROM_RUN_ID)
    snapshot_index = run_metadata.get(wire.FORKED_FROM_SNAPSHOT)
    if not isinstance(snapshot_index, int) or snapshot_index < 0:
        raise ValueError(f"{wire.FORKED_FROM_SNAPSHOT} must be a non-negative integer, got {snapshot_index!r}")
    return run_id, snapshot_index


def _check_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(metadata, Mapping):
        raise ValueError(f"metadata must be a mapping of str to str, got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"metadata must map str to str; {key!r}: {value!r} is not")
    return dict(metadata)


@dataclass
class StepRecorder(AbstractCapability[AgentDepsT]):
    """Records every step of an agent run to a steprec recorder: events, snapshots, tool effects.

    It keeps the semantics of pydantic-ai-harness's `StepPersistence` while the
    store lives in another process: run-boundary and step events, a continuable
    snapshot after every settled tool cycle (and on failure), and a
    `started`/`completed`/`failed` ledger per tool call. Snapshots and
    tool-effect starts are in this process's journal on disk before the hook
    returns (`delivery`), so a process killed right after a tool returned
    still leaves a resume point, delivered by the recorder or a later process.

    ```python
    agent = Agent(model, capabilities=[StepRecorder(agent_name="librarian")])
    ```

    Read runs back with `steprec.query.RecorderClient` and `continue_run`.
    """

    id: str | None = field(default="step_recorder", kw_only=True)
    """Stable capability id, so durable-execution journals find the same operations on replay."""

    endpoint: str = field(default_factory=lambda: os.environ.get("STEPREC_ENDPOINT", DEFAULT_ENDPOINT))
    """The recorder's OTLP/gRPC address (`host:port`); `STEPREC_ENDPOINT` sets the default."""

    agent_name: str | None = None
    """Logical agent name; also folded into the derived run id (see `run_id`)."""

    run_id: str | None = None
    """Id of this one `Agent.run`. Explicit: used as-is, single-use (a second registration raises
    `ValueError`). Unset with `agent_name` set: derived from both. Neither: `ctx.run_id`."""

    parent_run_id: str | None = None
    """Run that spawned this one; inferred from an enclosing recorded run when unset."""

    metadata: dict[str, str] = field(default_factory=dict)
    """Free-form strings stored on the run and on every record."""

    capture_frontier: bool = False
    """Also snapshot accepted requests before model calls and tool-call frontiers before execution."""

    max_snapshots_per_run: int | None = None
    """Retention the recorder applies to this run's snapshots (None: the recorder's default)."""

    delivery: Literal["journal", "acknowledged", "best_effort"] = "journal"
    """`journal` (default): snapshots and tool-effect starts return once they are in this process's
    journal (one `write()`, kept by the kernel if the process is killed); registration and the run's
    end wait for the recorder. `acknowledged`: every durable hook waits for the recorder's answer,
    for hosts whose disk may vanish with them. `best_effort`: only registration waits; a crash can
    lose the records still in memory. docs/delivery.md has what each costs and leaves after a crash."""

    timeout_seconds: float = 5.0
    """How long one request to the recorder may take before it counts as unreachable (records stay journaled)."""

    journal_dir: Path | None = None
    """This process's journal folder (`STEPREC_JOURNAL_DIR`, else per endpoint under ~/.local/state/steprec)."""

    journal_max_bytes: int = 256 << 20
    """Bound of what the journal holds unacknowledged; past it records are dropped, counted and logged."""

    journal_fsync: bool = False
    """fsync every journal append too, so records survive power loss, not only a killed process."""

    token: str | None = field(default_factory=lambda: os.environ.get("STEPREC_TOKEN") or None, repr=False)
    """Bearer token for a recorder started with one (`STEPREC_TOKEN` sets the default). Never printed."""

    tls_ca: Path | None = None
    """PEM CA to verify the recorder's certificate (an `https://` endpoint without it uses system roots)."""

    tls_cert: Path | None = None
    tls_key: Path | None = None
    """Client certificate and key, for a recorder that requires mutual TLS."""

    _tls: ClientTLS = field(default_factory=ClientTLS, init=False, repr=False)
    _pipeline: OrderedDeliveryProcessor | None = field(default=None, init=False, repr=False)
    _resets_seen: int = field(default=0, init=False, repr=False)
    _scope: _records.RunScope | None = field(default=None, init=False, repr=False)
    _event_sequence: int = field(default=0, init=False, repr=False)
    _snapshot_sequence: int = field(default=0, init=False, repr=False)
    _effect_sequence: int = field(default=0, init=False, repr=False)
    _encoder: SnapshotEncoder = field(default_factory=SnapshotEncoder, init=False, repr=False)
    _last_snapshot: tuple[Keyed, int] | None = field(default=None, init=False, repr=False)
    """The history and step of the run's latest snapshot, re-sent at the run's end if it may be lost."""
    _annotations: dict[str, dict[str, str]] = field(default_factory=dict, init=False, repr=False)
    _in_flight: set[str] = field(default_factory=set, init=False, repr=False)
    _forked_from: tuple[str, int] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        _check_endpoint(self.endpoint)
        self.metadata = _check_metadata(self.metadata)
        if self.run_id is not None:
            check_run_id(self.run_id)
        if self.parent_run_id is not None:
            check_run_id(self.parent_run_id, what="parent_run_id")
        if self.max_snapshots_per_run is not None and (
            not isinstance(self.max_snapshots_per_run, int) or self.max_snapshots_per_run < 1
        ):
            raise ValueError(f"max_snapshots_per_run must be a positive integer, got {self.max_snapshots_per_run!r}")
        if not isinstance(self.timeout_seconds, (int, float)) or self.timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be a positive number, got {self.timeout_seconds!r}")
        if (
            isinstance(self.journal_max_bytes, bool)
            or not isinstance(self.journal_max_bytes, int)
            or self.journal_max_bytes < _MIN_JOURNAL_BYTES
        ):
            raise ValueError(
                f"journal_max_bytes must be an integer of at least 1 MiB (1048576), got {self.journal_max_bytes!r}"
            )
        if self.delivery not in _DELIVERY_MODES:
            raise ValueError(f"delivery must be one of {', '.join(map(repr, _DELIVERY_MODES))}, got {self.delivery!r}")
        self.journal_dir = check_journal_dir(Path(self.journal_dir or default_journal_dir(self.endpoint)))
        self._tls = ClientTLS(self.tls_ca, self.tls_cert, self.tls_key)

    @classmethod
    def from_spec(cls, *args: Any, **kwargs: Any) -> StepRecorder[Any]:
        """Build from a serialised agent spec; an unknown option is an error, never silently ignored."""
        if args:
            raise ValueError("StepRecorder spec options must be given by name")
        known = {f.name for f in fields(cls) if f.init and not f.name.startswith("_")}
        if unknown := sorted(set(kwargs) - known):
            raise ValueError(f"unknown StepRecorder option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**kwargs)

    # -- per-run materialisation ---------------------------------------------------------------

    async def for_run(self, ctx: RunContext[AgentDepsT]) -> AbstractCapability[AgentDepsT]:
        """A fresh per-run copy with run id, parent and agent name resolved.

        Reads the enclosing recorded run *before* this run's `wrap_run`
        replaces it, which is how a delegate's `parent_run_id` points at its
        orchestrator. Per-run counters start at zero in the copy, so
        idempotency keys repeat exactly when a durable run is replayed.
        """
        if self.run_id is not None:
            run_id = self.run_id
        elif ctx.run_id is None:
            raise RuntimeError("StepRecorder needs the agent graph to assign RunContext.run_id")
        elif self.agent_name is not None:
            run_id = derive_run_id(self.agent_name, ctx.run_id)
        else:
            run_id = ctx.run_id
        enclosing = active_recording.get()
        parent = self.parent_run_id
        if parent is None and enclosing is not None and enclosing._scope is not None:
            parent = enclosing._scope.run_id
        agent_name = self.agent_name
        if agent_name is None and ctx.agent is not None:
            agent_name = ctx.agent.name
        run = replace(self, run_id=run_id, parent_run_id=parent, agent_name=agent_name)
        run._pipeline = pipeline_for(
            DeliveryOptions(
                endpoint=self.endpoint,
                timeout_seconds=float(self.timeout_seconds),
                journal_dir=self.journal_dir,
                journal_max_bytes=self.journal_max_bytes,
                journal_fsync=bool(self.journal_fsync),
                token=self.token,
                tls=self._tls,
            )
        )
        run._resets_seen = run._pipeline.snapshot_resets
        run._scope = _records.RunScope(run_id, ctx.conversation_id, parent, agent_name, self.metadata)
        run._forked_from = _fork_origin(ctx.metadata)
        return run

    def compaction_transcript_handle(self) -> str | None:
        """The run id the recorder stores this run under, for compaction receipts; None before `for_run`.

        Satisfies pydantic-ai-harness's compaction `TranscriptHandleProvider` protocol structurally, as
        the reference's `StepPersistence` does, without importing it. A handle names the run's recorded
        history (`RecorderClient.list_snapshots(handle)`); it does not promise the pre-compaction
        transcript is still there: snapshots may hold compacted history, and retention drops old ones.
        """
        return self._scope.run_id if self._scope is not None else None

    @property
    def recording(self) -> tuple[OrderedDeliveryProcessor, _records.RunScope]:
        if self._pipeline is None or self._scope is None:
            raise RuntimeError("StepRecorder hook called before for_run materialised the run")
        return self._pipeline, self._scope

    # -- writing ---------------------------------------------------------------------------------
    #
    # Every write is a pydantic-ai durable operation with serialisable arguments, and every
    # timestamp is read inside one (in `_records`), so a durable-execution engine journals the
    # write and replays it with the same values. Per-run counters advance outside the operations:
    # replay re-runs the hooks in the same order and regenerates the same idempotency keys.

    def _emit(self, record: Record) -> None:
        pipeline, _ = self.recording
        pipeline.emit(record)

    async def _acknowledged(self) -> Delivery:
        """Wait until every record emitted so far is acknowledged (or journaled, while the recorder is unreachable)."""
        pipeline, _ = self.recording
        return await asyncio.wrap_future(pipeline.barrier())

    async def _settle(self, wait: str) -> str:
        """Make the records emitted so far as safe as the delivery mode promises at this point.

        `wait` is `none` (a step event: it rides with the next durable write), `durable` (a resume
        point or a tool start: journaled, or acknowledged in `acknowledged` mode) or `end` (the run's
        last record: acknowledged, so a reader right after `Agent.run` sees the whole run; never in
        `best_effort`). A recorder that is unreachable is never waited for.
        """
        if wait == "none" or self.delivery == "best_effort":
            return "queued"
        if wait == "durable" and self.delivery == "journal":
            pipeline, _ = self.recording
            return pipeline.journal().value
        return (await self._acknowledged()).value

    def _operation(self, ctx: RunContext[Any], name: str, method: Any) -> Any:
        """`method` (a `durable_operation` named `name`) bound to self: through pydantic-ai's durable dispatch
        when a durability engine bound that operation to this run, else the plain method.

        The decorator's own wrapper binds `inspect.signature` on every call, a fifth of what steprec
        cost an agent per step (issue 18); without an engine it only calls the method, so skipping it
        changes nothing. A context that does not say (a pydantic-ai without the attribute) goes
        through the wrapper.
        """
        operations = getattr(ctx, "_durable_operations", _UNKNOWN)
        if operations is _UNKNOWN or (operations and (self.id, name) in operations):
            return method.__get__(self)
        return method.__wrapped__.__get__(self)

    @durable_operation(name="registration_id")
    async def _new_registration_id(self) -> str:
        return str(uuid.uuid4())

    @durable_operation(name="append_event")
    async def _append_event(
        self,
        *,
        kind: str,
        step_index: int,
        event_index: int,
        tool_call_id: str | None = None,
        tool_name: str | None = None,
        error: ErrorText | None = None,
        registration_id: str | None = None,
        forked_from_run_id: str | None = None,
        forked_from_snapshot: int | None = None,
        wait: str = "none",
    ) -> str:
        pipeline, scope = self.recording
        record = _records.step_event(
            scope,
            kind,
            step_index=step_index,
            # The reference key: hook order is deterministic under replay, the sequence separates
            # repeated events within a step, the rest keeps the key readable.
            idempotency_key=f"{event_index}:{step_index}:{kind}:{tool_call_id or ''}",
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            error=error,
            registration_id=registration_id,
            max_snapshots=self.max_snapshots_per_run if registration_id else None,
            forked_from=(forked_from_run_id, forked_from_snapshot) if forked_from_run_id is not None else None,
        )
        self._emit(record)
        if registration_id is None:
            return await self._settle(wait)
        # A registration is always waited for: a refused one must fail this run.
        await self._acknowledged()
        refusal = pipeline.pop_refusal(record)
        if refusal is not None and refusal.code == wire.REFUSED_RUN_ID_TAKEN:
            raise ValueError(
                f"StepRecorder: run_id {scope.run_id!r} is already registered with the recorder. "
                "run_id is single-use; pass conversation_id= to Agent.run for multi-turn grouping instead."
            )
        return "acknowledged"

    async def _record_event(
        self,
        ctx: RunContext[AgentDepsT],
        kind: str,
        *,
        tool_call_id: str | None = None,
        tool_name: str | None = None,
        error: BaseException | None = None,
        registration_id: str | None = None,
        wait: str = "none",
    ) -> None:
        fork = self._forked_from if registration_id is not None else None
        event_index = self._event_sequence
        self._event_sequence += 1
        await self._operation(ctx, "append_event", StepRecorder._append_event)(
            kind=kind,
            step_index=ctx.run_step,
            event_index=event_index,
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            error=ErrorText.of(error) if error is not None else None,
            registration_id=registration_id,
            forked_from_run_id=fork[0] if fork else None,
            forked_from_snapshot=fork[1] if fork else None,
            wait=wait,
        )

    @durable_operation(name="save_snapshot")
    async def _persist_snapshot(
        self,
        *,
        snapshot_index: int,
        step_index: int,
        state: str,
        base_index: int | None,
        keep: int,
        append_refs: bytes,
        new_messages: list[str],
    ) -> str:
        pipeline, scope = self.recording
        inline, fragments = _records.split_large_messages(scope, step_index=step_index, new_messages=new_messages)
        for fragment in fragments:
            self._emit(fragment)
        record = _records.snapshot(
            scope,
            snapshot_index=snapshot_index,
            step_index=step_index,
            state=state,
            idempotency_key=f"{snapshot_index}:{step_index}:{state}",
            base_index=base_index,
            keep=keep,
            append_refs=append_refs,
            new_messages=inline,
        )
        self._emit(record)
        delivery = await self._settle("durable")
        refusal = pipeline.pop_refusal(record)
        return f"refused:{refusal.code}" if refusal is not None else delivery

    async def _save_snapshot(self, ctx: RunContext[AgentDepsT], history: Keyed, step_index: int) -> None:
        """Send a snapshot, durable as the delivery mode says: this is the resume point after a crash.

        The history arrives serialised (`SnapshotEncoder.keyed`), a copy, so later changes to the
        live list cannot alter what was saved. If the journal dropped anything, or the recorder
        refused a snapshot, since this run's last snapshot (`snapshot_resets`), that snapshot may be
        what was lost: this one goes whole, so the recorder can store it without the base it never
        got. (A journaled snapshot's refusal arrives after the hook returned; `_confirm_last_snapshot`
        covers the last one.)
        """
        pipeline, scope = self.recording
        if pipeline.snapshot_resets != self._resets_seen:
            self._resets_seen = pipeline.snapshot_resets
            self._encoder.forget()
        state = "complete" if history.settled else "interrupted"
        snapshot_index = self._snapshot_sequence
        self._snapshot_sequence += 1
        for attempt in range(2):
            delta = self._encoder.encode(history)
            delivery = await self._operation(ctx, "save_snapshot", StepRecorder._persist_snapshot)(
                snapshot_index=snapshot_index,
                step_index=step_index,
                state=state,
                base_index=delta.base_index,
                keep=delta.keep,
                append_refs=delta.append_refs,
                new_messages=delta.new_messages,
            )
            if delivery not in _RESEND_WHOLE or attempt:
                break
            # The recorder lacks messages this run sent before (pruned, or its data was lost):
            # send this snapshot whole, with every message, under the same key.
            self._encoder.forget()
            self._resets_seen = pipeline.snapshot_resets  # that refusal is answered here
        self._encoder.commit(snapshot_index, delta)
        self._last_snapshot = (history, step_index)
        await ctx.emit(
            SnapshotSaved(
                run_id=scope.run_id,
                conversation_id=scope.conversation_id,
                step_index=step_index,
                snapshot_index=snapshot_index,
                state=state,
                delivery=delivery,
            )
        )

    @durable_operation(name="record_tool_effect")
    async def _persist_tool_effect(
        self,
        *,
        status: str,
        effect_index: int,
        step_index: int,
        tool_call_id: str,
        tool_name: str,
        idempotency_key: str | None = None,
        effect_summary: str | None = None,
        error: ErrorText | None = None,
        wait: str = "none",
    ) -> str:
        _, scope = self.recording
        self._emit(
            _records.tool_effect(
                scope,
                status,
                step_index=step_index,
                record_key=f"{effect_index}:{tool_call_id}:{status}",
                tool_call_id=tool_call_id,
                tool_name=tool_name,
                idempotency_key=idempotency_key,
                effect_summary=effect_summary,
                error=error,
            )
        )
        return await self._settle(wait)

    async def _record_tool_effect(
        self,
        ctx: RunContext[Any],
        status: str,
        tool_call_id: str,
        tool_name: str,
        *,
        error: BaseException | None = None,
        wait: str = "none",
    ) -> None:
        annotations = self._annotations.get(tool_call_id, {})
        effect_index = self._effect_sequence
        self._effect_sequence += 1
        await self._operation(ctx, "record_tool_effect", StepRecorder._persist_tool_effect)(
            status=status,
            effect_index=effect_index,
            step_index=ctx.run_step,
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            idempotency_key=annotations.get(wire.BODY_EFFECT_IDEMPOTENCY_KEY),
            effect_summary=annotations.get(wire.BODY_EFFECT_SUMMARY),
            error=ErrorText.of(error) if error is not None else None,
            wait=wait,
        )

    async def annotate(self, ctx: RunContext[Any], idempotency_key: str | None, effect_summary: str | None) -> None:
        """Merge annotations into the in-flight tool's record; they ride along on its terminal record too."""
        if ctx.tool_call_id is None or ctx.tool_name is None or ctx.tool_call_id not in self._in_flight:
            return
        annotations = self._annotations.setdefault(ctx.tool_call_id, {})
        if idempotency_key is not None:
            annotations[wire.BODY_EFFECT_IDEMPOTENCY_KEY] = idempotency_key
        if effect_summary is not None:
            annotations[wire.BODY_EFFECT_SUMMARY] = effect_summary
        await self._record_tool_effect(ctx, "annotated", ctx.tool_call_id, ctx.tool_name, wait="durable")

    # -- run boundaries --------------------------------------------------------------------------

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler) -> AgentRunResult[Any]:
        """Make this run the enclosing one for delegates started from its tools."""
        token = active_recording.set(self)
        history_token = live_history.set(None)
        try:
            return await handler()
        finally:
            live_history.reset(history_token)
            active_recording.reset(token)

    async def before_run(self, ctx: RunContext[AgentDepsT]) -> None:
        """Register the run and emit `run_started`, waiting for the recorder's answer.

        The registration id distinguishes a retried registration (accepted) from
        a second `Agent.run` claiming the same explicit run id, which the
        recorder refuses: the tool-effect ledger keys on `(run_id,
        tool_call_id)` and providers reuse tool-call ids, so a silent collision
        would erase the unknown-after-crash signal.
        """
        registration_id = await self._operation(ctx, "registration_id", StepRecorder._new_registration_id)()
        await self._record_event(ctx, "run_started", registration_id=registration_id)

    async def after_run(self, ctx: RunContext[AgentDepsT], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        """Emit `run_completed`, saving a final snapshot only when the final history differs from the last one.

        The comparison re-serialises the final history, so a capability that
        rewrote messages in place (same length, new content) is caught too.
        """
        history = self._encoder.keyed(result.all_messages(), fresh=True)
        if history.settled and not self._encoder.is_previous(history):
            step = self._last_snapshot[1] if self._last_snapshot is not None else ctx.run_step
            await self._save_snapshot(ctx, history, step)
        await self._record_event(ctx, "run_completed", wait="end")
        await self._confirm_last_snapshot(ctx)
        return result

    async def _confirm_last_snapshot(self, ctx: RunContext[AgentDepsT]) -> None:
        """After the run's end was acknowledged: if a snapshot was dropped or refused since the run's
        last one was built, save that history again, whole, and wait for it.

        In the journal mode a snapshot's refusal (a delta on messages a prune removed meanwhile)
        arrives after its hook returned; the next snapshot goes whole, but the last one has no next.
        Without this the run could end with no resume point the recorder holds.
        """
        pipeline, _ = self.recording
        if self._last_snapshot is None or pipeline.snapshot_resets == self._resets_seen:
            return
        await self._save_snapshot(ctx, *self._last_snapshot)
        await self._acknowledged()

    async def on_run_error(self, ctx: RunContext[AgentDepsT], *, error: BaseException) -> AgentRunResult[Any]:
        """Save the live at-failure history as the last resume point, then emit `run_failed` and re-raise.

        `complete` when every tool call in it is answered, `interrupted`
        otherwise; a history with no model response is not worth resuming
        (unless frontier capture asked for every accepted request).
        """
        stashed = live_history.get()
        if stashed is not None:
            captured = list(stashed[0])
            if has_model_response(captured) or (self.capture_frontier and captured):
                await self._save_snapshot(ctx, self._encoder.keyed(captured, fresh=True), stashed[1])
        await self._record_event(ctx, "run_failed", error=error, wait="end")
        await self._confirm_last_snapshot(ctx)
        raise error

    # -- model requests --------------------------------------------------------------------------

    async def before_model_request(
        self, ctx: RunContext[AgentDepsT], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        if self.capture_frontier:
            live_history.set((ctx.messages, ctx.run_step))
            await self._save_snapshot(ctx, self._encoder.keyed(ctx.messages), ctx.run_step)
        await self._record_event(ctx, "model_request_started")
        return request_context

    async def after_model_request(
        self, ctx: RunContext[AgentDepsT], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        await self._record_event(ctx, "model_request_completed")
        return response

    async def on_model_request_error(
        self, ctx: RunContext[AgentDepsT], *, request_context: ModelRequestContext, error: Exception
    ) -> ModelResponse:
        """Emit `model_request_failed` and re-raise; `on_run_error` saves the history that holds the request."""
        await self._record_event(ctx, "model_request_failed", error=error)
        raise error

    # -- tool calls ------------------------------------------------------------------------------

    async def before_tool_execute(
        self, ctx: RunContext[AgentDepsT], *, call: ToolCallPart, tool_def: ToolDefinition, args: dict[str, Any]
    ) -> dict[str, Any]:
        """Record the tool effect as `started`, durable before the tool runs (journaled, or acknowledged).

        If the process dies inside the tool, that record is what tells a later
        reader the side effect may or may not have happened.
        """
        self._in_flight.add(call.tool_call_id)
        await self._record_tool_effect(ctx, "started", call.tool_call_id, tool_def.name)
        await self._record_event(
            ctx, "tool_call_started", tool_call_id=call.tool_call_id, tool_name=tool_def.name, wait="durable"
        )
        return args

    async def wrap_tool_execute(
        self,
        ctx: RunContext[AgentDepsT],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: WrapToolExecuteHandler,
    ) -> Any:
        """Record a tool that raised `ModelRetry` or `ToolFailed` as `failed`, with the message as its error.

        pydantic-ai treats both as control flow and calls no error hook, so without this the call
        would stay `started` forever and a finished run would list it among the unresolved effects
        (pydantic-ai-harness 0.62.0 has that defect). The tool did run and its outcome is known.
        """
        try:
            return await handler(args)
        except _RETRIED_OR_FAILED as error:
            if call.tool_call_id in self._in_flight:
                self._in_flight.discard(call.tool_call_id)
                await self._record_tool_effect(ctx, "failed", call.tool_call_id, tool_def.name, error=error)
                await self._record_event(
                    ctx, "tool_call_failed", tool_call_id=call.tool_call_id, tool_name=tool_def.name, error=error
                )
            raise

    async def after_tool_execute(
        self,
        ctx: RunContext[AgentDepsT],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        result: Any,
    ) -> Any:
        self._in_flight.discard(call.tool_call_id)
        await self._record_tool_effect(ctx, "completed", call.tool_call_id, tool_def.name)
        await self._record_event(ctx, "tool_call_completed", tool_call_id=call.tool_call_id, tool_name=tool_def.name)
        return result

    async def on_tool_execute_error(
        self,
        ctx: RunContext[AgentDepsT],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        error: Exception,
    ) -> Any:
        self._in_flight.discard(call.tool_call_id)
        await self._record_tool_effect(ctx, "failed", call.tool_call_id, tool_def.name, error=error)
        await self._record_event(
            ctx, "tool_call_failed", tool_call_id=call.tool_call_id, tool_name=tool_def.name, error=error
        )
        raise error

    # -- node boundaries -------------------------------------------------------------------------

    async def after_node_run(
        self, ctx: RunContext[AgentDepsT], *, node: AgentNode[AgentDepsT], result: NodeResult[AgentDepsT]
    ) -> NodeResult[AgentDepsT]:
        """Snapshot after a settled `CallToolsNode`, folding in the pending tool-return request.

        The returned `ModelRequestNode` holds the tool returns and is not yet in
        `ctx.messages`; without folding it in, a process killed right after a
        tool returned would have no resume point holding that return. Every
        boundary also re-stashes the live list for `on_run_error`; the snapshot
        candidate is a new list so the stash never sees `result.request` twice.
        """
        live_history.set((ctx.messages, ctx.run_step))
        if self.capture_frontier and isinstance(node, ModelRequestNode):
            await self._save_snapshot(ctx, self._encoder.keyed(ctx.messages), ctx.run_step)
        if isinstance(node, CallToolsNode):
            if isinstance(result, ModelRequestNode):
                history = self._encoder.keyed(ctx.messages, provisional=[result.request])
            else:
                history = self._encoder.keyed(ctx.messages)
            if history.settled:
                await self._save_snapshot(ctx, history, ctx.run_step)
        return result


async def annotate_tool_effect(
    ctx: RunContext[Any], *, idempotency_key: str | None = None, effect_summary: str | None = None
) -> None:
    """Attach an idempotency key and/or a summary to the in-flight tool call's effect record.

    Call from inside a tool that changes the outside world, so whoever
    inspects unresolved effects after a crash can tell whether a replay is
    safe. The terminal `completed`/`failed` record keeps these values. A no-op
    outside a tool call recorded by StepRecorder.
    """
    recording = active_recording.get()
    if recording is not None:
        await recording.annotate(ctx, idempotency_key, effect_summary)
