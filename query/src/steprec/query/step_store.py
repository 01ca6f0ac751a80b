"""RecorderStepStore: pydantic-ai-harness's `StepStore`, kept by a steprec recorder.

`StepPersistence(store=RecorderStepStore(...))` writes the same OTLP records a
`StepRecorder` sends (docs/wire-format.md), through the same acknowledged,
journaling delivery pipeline, and reads them back through `RecorderClient`. Needs
the `harness` extra; docs/harness-store.md says what maps to what.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TypeVar

try:
    from pydantic_ai_harness.step_persistence import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord
    from steprec.exporter import StepRecorder, _records
    from steprec.exporter._acknowledged_export import Refusal
    from steprec.exporter._capability import _RESEND_WHOLE, DEFAULT_ENDPOINT, _check_endpoint
    from steprec.exporter._delivery import Delivery
    from steprec.exporter._identity import check_run_id
    from steprec.exporter._pipeline import DeliveryOptions, pipeline_for
    from steprec.exporter._records import Record
    from steprec.exporter._snapshots import SnapshotEncoder
    from steprec.proto.journal import default_journal_dir
except ModuleNotFoundError as missing:
    raise ImportError(
        f"steprec.query.RecorderStepStore needs {missing.name}; install it with: pip install 'steprec-query[harness]'"
    ) from missing

from steprec.proto import wire
from steprec.proto.tls import ClientTLS

from . import types as client_types
from .client import RecorderClient, RecorderUnavailable
from .closing import AsyncClosing

REGISTRATION_KEY = "0:0:run_started:"
"""The key StepPersistence (and StepRecorder) give a run's first event, `run_started`.

`register_run` sends the registration as that event, so the `run_started` the
harness appends right after is a replay the recorder suppresses: one event, as
in the harness's own stores.
"""

_ENDED = {"run_completed", "run_failed"}
_KEPT_RUNS = 1024
"""Runs the store remembers at once (registration, snapshot encoder); a forgotten run is asked about
again, and its next snapshot is sent whole."""
_ERROR_TYPE = re.compile(r"[A-Za-z_][\w.]*(?=\()")
_KEYLESS_INDEX = 1 << 30
"""Snapshots without a StepPersistence key (or a second key at one sequence) are numbered from here,
so they never take the index a keyed save of the same run will use. The recorder's indexes are 32-bit."""


def _keep_recent(runs: OrderedDict, run_id: str, value: object) -> None:
    """Remember `value` for the run, forgetting the least recently used runs past `_KEPT_RUNS`."""
    runs[run_id] = value
    runs.move_to_end(run_id)
    while len(runs) > _KEPT_RUNS:
        runs.popitem(last=False)


def _key_sequence(key: str | None) -> int | None:
    """The `<n>:` prefix of a StepPersistence snapshot key: its save sequence within the run."""
    prefix, separator, _ = (key or "").partition(":")
    return int(prefix) if separator and prefix.isdigit() else None


def _error_text(error: str | None) -> _records.ErrorText | None:
    """The harness stores `repr(exception)`; its class name is the part before the parenthesis."""
    if error is None:
        return None
    match = _ERROR_TYPE.match(error)
    return _records.ErrorText(match[0] if match else "Exception", error)


@dataclass
class _RunSnapshots:
    """What the store knows of one run's snapshots: enough to send the next one as a delta.

    `keys`, `indexes` and `high_water` cover every snapshot the recorder holds or held for the run,
    so a save the recorder may suppress as a replay is never the base of the next delta, and no two
    snapshots of the run share an index.
    """

    keys: set[str] = field(default_factory=set)
    indexes: set[int] = field(default_factory=set)
    high_water: int | None = None
    encoder: SnapshotEncoder = field(default_factory=SnapshotEncoder)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def may_be_replay(self, key: str | None) -> bool:
        sequence = _key_sequence(key)
        return key is not None and (
            key in self.keys or (sequence is not None and self.high_water is not None and sequence <= self.high_water)
        )

    def index_for(self, key: str | None) -> int:
        """The key's `<n>:` sequence, unless the run has no such key or already has a snapshot at that index."""
        sequence = _key_sequence(key)
        if sequence is not None and sequence not in self.indexes:
            return sequence
        return max((i for i in self.indexes if i >= _KEYLESS_INDEX), default=_KEYLESS_INDEX - 1) + 1

    def note(self, key: str | None, snapshot_index: int) -> None:
        self.indexes.add(snapshot_index)
        if key is not None:
            self.keys.add(key)
        if (sequence := _key_sequence(key)) is not None:
            self.high_water = sequence if self.high_water is None else max(self.high_water, sequence)


class RecorderStepStore(AsyncClosing):
    """A pydantic-ai-harness `StepStore` whose runs live in a steprec recorder.

    ```python
    store = RecorderStepStore(endpoint="127.0.0.1:4317")
    agent = Agent(model, capabilities=[StepPersistence(store=store)])
    history = await continue_run(store, run_id=run_id)  # pydantic_ai_harness.step_persistence
    ```

    Every write returns once the recorder acknowledged it (or, with the recorder
    unreachable, once it is in the local journal, as for `StepRecorder`); a
    refused write raises `ValueError` with the recorder's reason. Reads go
    through `RecorderClient` and return the harness's own record types.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        token: str | None = None,
        tls_ca: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        max_snapshots_per_run: int | None = None,
        timeout_seconds: float = 10.0,
    ) -> None:
        self.endpoint = _check_endpoint(endpoint or os.environ.get("STEPREC_ENDPOINT", DEFAULT_ENDPOINT))
        # The harness's own rule for its stores: a bound below one cannot serve both read modes.
        if max_snapshots_per_run is not None and not isinstance(max_snapshots_per_run, int):
            raise ValueError(f"max_snapshots_per_run must be an int >= 1 or None, got {max_snapshots_per_run!r}")
        if max_snapshots_per_run is not None and max_snapshots_per_run < 1:
            raise ValueError(f"max_snapshots_per_run must be >= 1 or None, got {max_snapshots_per_run!r}")
        if not isinstance(timeout_seconds, (int, float)) or timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be a positive number, got {timeout_seconds!r}")
        self.max_snapshots_per_run = max_snapshots_per_run
        self.timeout_seconds = float(timeout_seconds)
        self._token = token or os.environ.get("STEPREC_TOKEN") or None
        self._tls_files = (tls_ca, tls_cert, tls_key)
        self._delivery = DeliveryOptions(
            endpoint=self.endpoint,
            timeout_seconds=self.timeout_seconds,
            journal_dir=default_journal_dir(self.endpoint),
            journal_max_bytes=StepRecorder.journal_max_bytes,
            token=self._token,
            tls=ClientTLS(*self._tls_files),
        )
        tls_ca, tls_cert, tls_key = self._tls_files
        self._reader = RecorderClient(
            self.endpoint, timeout_seconds=self.timeout_seconds, token=self._token,
            tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
        )  # fmt: skip
        self._registrations: OrderedDict[str, str] = OrderedDict()
        self._snapshots: OrderedDict[str, _RunSnapshots] = OrderedDict()

    async def close(self) -> None:
        """Close the read channel. Nothing is pending: every write was acknowledged before it returned."""
        await self._reader.close()

    async def _send(self, *records: Record) -> Refusal | None:
        """Emit `records` in order and wait for the recorder's answer; the first refusal among them, if any.

        The pipeline is looked up per write, like StepRecorder does per run, so a store outlives
        `shutdown_pipelines()`; it is shared with every StepRecorder of the same options.
        """
        pipeline = pipeline_for(self._delivery)
        for record in records:
            pipeline.emit(record)
        delivery = await asyncio.wrap_future(pipeline.barrier())
        refusals = [pipeline.pop_refusal(record) for record in records]
        if delivery is Delivery.DROPPED:
            raise RecorderUnavailable(
                f"recorder at {self.endpoint} is unreachable and the journal is full; the write was dropped"
            )
        return next((refusal for refusal in refusals if refusal is not None), None)

    async def _write(self, record: Record) -> None:
        if (refusal := await self._send(record)) is not None:
            raise ValueError(f"the recorder refused {record.event_name} [{refusal.code}]: {refusal.reason}")

    # -- runs --------------------------------------------------------------------------------

    async def register_run(self, record: RunRecord) -> None:
        """Register the run as the recorder does: by its `run_started` event, carrying the registration id.

        A run id registered by a different registration is refused with `ValueError`, as
        `StepPersistence` words it (the harness checks `get_run` first; this closes the race).
        """
        check_run_id(record.run_id)
        registration_id = record.registration_id or str(uuid.uuid4())
        refusal = await self._send(
            _records.step_event(
                self._scope(record.run_id, record.conversation_id, record.parent_run_id, record.agent_name,
                            record.metadata),
                "run_started",
                step_index=0,
                idempotency_key=REGISTRATION_KEY,
                registration_id=registration_id,
                max_snapshots=self.max_snapshots_per_run,
                at_unix_nano=client_types.to_unix_nano(record.started_at),
            )
        )  # fmt: skip
        if refusal is not None and refusal.code == wire.REFUSED_RUN_ID_TAKEN:
            raise ValueError(
                f"StepPersistence: run_id {record.run_id!r} is already in the store. `run_id` is single-shot; "
                "pass `conversation_id=` to `Agent.run` for multi-turn grouping instead."
            )
        if refusal is not None:
            raise ValueError(f"the recorder refused the registration of {record.run_id!r}: {refusal.reason}")
        _keep_recent(self._registrations, record.run_id, registration_id)

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        run = await self._reader.get_run(run_id)
        return _as(RunRecord, run) if run is not None else None

    async def list_runs(
        self, *, parent_run_id: str | None = None, conversation_id: str | None = None
    ) -> list[RunRecord]:
        """Matching runs, oldest start first (ties in registration order), as the protocol asks."""
        runs = await self._reader.list_runs(parent_run_id=parent_run_id, conversation_id=conversation_id)
        return [_as(RunRecord, run) for run in runs]

    # -- events ------------------------------------------------------------------------------

    async def append_event(self, event: StepEvent) -> None:
        """Append one event; one whose idempotency key the run already has is acknowledged and not stored again."""
        check_run_id(event.run_id)
        registration_id = None
        if event.kind == "run_started":  # the recorder wants the registration on every run_started
            registration_id = self._registrations.get(event.run_id)
            if registration_id is None:
                run = await self.get_run(run_id=event.run_id)
                registration_id = run.registration_id if run is not None and run.registration_id else str(uuid.uuid4())
                _keep_recent(self._registrations, event.run_id, registration_id)
        await self._write(
            _records.step_event(
                self._scope(event.run_id, event.conversation_id, event.parent_run_id, event.agent_name, event.metadata),
                event.kind,
                step_index=event.step_index,
                idempotency_key=event.idempotency_key,
                tool_call_id=event.tool_call_id,
                tool_name=event.tool_name,
                error=_error_text(event.error),
                registration_id=registration_id,
                max_snapshots=self.max_snapshots_per_run if registration_id else None,
                at_unix_nano=client_types.to_unix_nano(event.timestamp),
            )
        )
        if event.kind in _ENDED:
            self._registrations.pop(event.run_id, None)
            self._snapshots.pop(event.run_id, None)

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        return [_as(StepEvent, event) for event in await self._reader.list_events(run_id)]

    # -- snapshots ---------------------------------------------------------------------------

    async def _run_snapshots(self, run_id: str) -> _RunSnapshots:
        """This run's snapshot state, learnt from the recorder the first time the store writes one."""
        state = self._snapshots.get(run_id)
        if state is None:
            state = _RunSnapshots()
            for summary in await self._reader.list_snapshots(run_id, include_interrupted=True):
                state.note(summary.idempotency_key, summary.snapshot_index)
        _keep_recent(self._snapshots, run_id, state)
        return state

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        """Save a snapshot as a delta of the run's previous one, under the harness's idempotency key.

        The recorder applies the harness's rules: a key it has seen, or one whose `<n>:` sequence is
        below the run's newest, is a replay and not stored; retention follows the run's registration.
        """
        check_run_id(snapshot.run_id)
        state = await self._run_snapshots(snapshot.run_id)
        key = snapshot.idempotency_key
        scope = self._scope(snapshot.run_id, snapshot.conversation_id, snapshot.parent_run_id, snapshot.agent_name)
        async with state.lock:
            snapshot_index = state.index_for(key)
            replay = state.may_be_replay(key)
            # The harness hands over deep copies, so keeping serialisations by identity would only hold memory.
            history = state.encoder.keyed([], provisional=snapshot.messages)
            for attempt in range(2):
                delta = state.encoder.encode(history)
                inline, fragments = _records.split_large_messages(
                    scope, step_index=snapshot.step_index, new_messages=delta.new_messages
                )
                record = _records.snapshot(
                    scope,
                    snapshot_index=snapshot_index,
                    step_index=snapshot.step_index,
                    state=snapshot.state,
                    idempotency_key=key,
                    base_index=delta.base_index,
                    keep=delta.keep,
                    append_refs=delta.append_refs,
                    new_messages=inline,
                    at_unix_nano=client_types.to_unix_nano(snapshot.timestamp),
                )
                refusal = await self._send(*fragments, record)
                if refusal is None:
                    break
                if f"refused:{refusal.code}" not in _RESEND_WHOLE or attempt:
                    raise ValueError(f"the recorder refused a snapshot of {snapshot.run_id!r}: {refusal.reason}")
                # The recorder lacks messages this store sent before (pruned, or lost): send it whole.
                state.encoder.forget()
            if replay:  # perhaps not stored: the next snapshot must not build on it
                state.encoder.forget()
            else:
                state.encoder.commit(snapshot_index, delta)
            state.note(key, snapshot_index)

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        snapshot = await self._reader.latest_snapshot(run_id, include_interrupted=include_interrupted)
        return _as(ContinuableSnapshot, snapshot) if snapshot is not None else None

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        """The run's retained snapshots in write order, with their messages (`interrupted` ones only if asked)."""
        reader = self._reader
        summaries = await reader.list_snapshots(run_id, include_interrupted=include_interrupted)
        snapshots = await asyncio.gather(*(reader.get_snapshot(run_id, s.snapshot_index) for s in summaries))
        return [_as(ContinuableSnapshot, snapshot) for snapshot in snapshots if snapshot is not None]

    # -- tool effects ------------------------------------------------------------------------

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        """Add a ledger record; the recorder's view of the call is its latest status and annotations.

        The harness's ledger is an upsert, so every call is a new record: its key is unique, and a
        redelivered copy of it is still stored once.
        """
        check_run_id(record.run_id)
        at = record.ended_at if record.status != "started" and record.ended_at is not None else record.started_at
        await self._write(
            _records.tool_effect(
                self._scope(record.run_id),
                record.status,
                step_index=0,
                record_key=f"{uuid.uuid4().hex}:{record.tool_call_id}:{record.status}",
                tool_call_id=record.tool_call_id,
                tool_name=record.tool_name,
                idempotency_key=record.idempotency_key,
                effect_summary=record.effect_summary,
                at_unix_nano=client_types.to_unix_nano(at),
            )
        )

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        effect = await self._reader.get_tool_effect(run_id, tool_call_id)
        return _as(ToolEffectRecord, effect) if effect is not None else None

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        return [_as(ToolEffectRecord, effect) for effect in await self._reader.list_unresolved_tool_effects(run_id)]

    @staticmethod
    def _scope(
        run_id: str,
        conversation_id: str | None = None,
        parent_run_id: str | None = None,
        agent_name: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> _records.RunScope:
        if parent_run_id is not None:
            check_run_id(parent_run_id, what="parent_run_id")
        return _records.RunScope(run_id, conversation_id, parent_run_id, agent_name, dict(metadata or {}))


_Record = TypeVar("_Record")


# -- RecorderClient records as the harness's own ----------------------------------------------


def _as(kind: type[_Record], record: object) -> _Record:
    """A steprec record as the harness dataclass of the same meaning: each of the harness's fields,
    copied from the steprec record's field of the same name (steprec's records have them all)."""
    values = {f.name: getattr(record, f.name) for f in fields(kind)}
    return kind(**{name: copy.copy(value) if isinstance(value, dict | list) else value
                   for name, value in values.items()})  # fmt: skip
