"""Record encoding: what StepRecorder builds is what the recorder decodes, field for field."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart
from steprec.exporter import _otlp, _records
from steprec.exporter import _snapshots as snapshots_module
from steprec.exporter._history import answer_calls
from steprec.exporter._otlp import RequestEnvelope
from steprec.exporter._snapshots import SnapshotEncoder
from steprec.proto import wire
from steprec.recorder.ingest.decode import SnapshotRecord, StepEventRecord, ToolEffectRecord, decode_request

SCOPE = _records.RunScope("run-1", "conv-1", "parent-1", "agent-a", {"team": "blue"})


def _request(*records: _records.Record) -> ExportLogsServiceRequest:
    """The records as the exporter sends them, parsed by the official OTLP protobuf classes."""
    envelope = RequestEnvelope({"service.name": "steprec"}, wire.SCOPE_NAME, "test")
    return ExportLogsServiceRequest.FromString(envelope.request([record.data for record in records]))


def _round_trip(*records):
    """Encode as the exporter does, parse as OTLP protobuf, decode as the recorder does."""
    decoded, refusals = decode_request(_request(*records))
    assert refusals == []
    return decoded


def test_step_event_round_trip() -> None:
    error = _records.ErrorText.of(ConnectionError("boom"))
    (event,) = _round_trip(
        _records.step_event(
            SCOPE, "tool_call_failed", step_index=4, idempotency_key="7:4:tool_call_failed:c1",
            tool_call_id="c1", tool_name="search", error=error,
        )
    )  # fmt: skip
    assert isinstance(event, StepEventRecord)
    assert (event.kind, event.tool_call_id, event.tool_name, event.error) == (
        "tool_call_failed", "c1", "search", repr(ConnectionError("boom")),
    )  # fmt: skip
    lineage = event.lineage
    assert (lineage.run_id, lineage.conversation_id, lineage.parent_run_id, lineage.agent_name) == (
        "run-1", "conv-1", "parent-1", "agent-a",
    )  # fmt: skip
    assert (lineage.step_index, lineage.idempotency_key) == (4, "7:4:tool_call_failed:c1")
    assert event.metadata == {"team": "blue"}
    assert lineage.at_unix_nano > 0


def test_run_started_carries_registration_and_retention() -> None:
    (event,) = _round_trip(
        _records.step_event(SCOPE, "run_started", step_index=0, idempotency_key="0:0:run_started:",
                            registration_id="reg-1", max_snapshots=5)
    )  # fmt: skip
    assert (event.registration_id, event.max_snapshots) == ("reg-1", 5)


def test_tool_effect_round_trip_keeps_annotations() -> None:
    (effect,) = _round_trip(
        _records.tool_effect(SCOPE, "completed", step_index=2, record_key="3:c9:completed", tool_call_id="c9",
                             tool_name="label", idempotency_key="label-42", effect_summary="added label")
    )  # fmt: skip
    assert isinstance(effect, ToolEffectRecord)
    assert (effect.status, effect.tool_call_id, effect.tool_name) == ("completed", "c9", "label")
    assert (effect.idempotency_key, effect.effect_summary, effect.lineage.idempotency_key) == (
        "label-42", "added label", "3:c9:completed",
    )  # fmt: skip


def _history(turns: int) -> list:
    messages: list = [ModelRequest(parts=[UserPromptPart("hi")])]
    for i in range(turns):
        messages.append(ModelResponse(parts=[ToolCallPart("echo", {"n": i}, tool_call_id=f"c{i}")]))
        messages.append(ModelRequest(parts=[ToolReturnPart("echo", f"r{i}", tool_call_id=f"c{i}")]))
    return messages


def test_snapshots_are_deltas_and_send_each_message_once() -> None:
    encoder = SnapshotEncoder()
    history = _history(1)
    first = encoder.encode(encoder.keyed(history))
    assert (first.base_index, first.keep, len(first.new_messages)) == (None, 0, 3)
    encoder.commit(0, first)

    history += _history(2)[3:]
    second = encoder.encode(encoder.keyed(history))
    assert (second.base_index, second.keep, len(second.new_messages)) == (0, 3, 2)
    assert len(second.append_refs) == 2 * wire.DIGEST_SIZE
    assert second.refs[:3] == first.refs
    # Each ref is the SHA-256 of the JSON sent for it.
    assert [hashlib.sha256(m.encode()).digest() for m in second.new_messages] == list(second.refs[3:])
    encoder.commit(1, second)

    # A rewritten history (same length, one message replaced) keeps only the common prefix.
    rewritten = [*history[:2], ModelRequest(parts=[ToolReturnPart("echo", "changed", tool_call_id="c0")]), *history[3:]]
    third = encoder.encode(encoder.keyed(rewritten))
    assert third.keep == 2 and len(third.new_messages) == 1


def test_a_folded_request_is_replaced_by_its_final_form_and_the_run_end_sees_whether_anything_changed() -> None:
    """The tool-return request folded in ahead of the graph is keyed, not kept: the next snapshot keeps
    everything before it and sends the request as pydantic-ai stamped it; `is_previous` (the run's end) tells
    an unchanged history from one edited in place."""
    encoder = SnapshotEncoder()
    history = _history(1)
    response = ModelResponse(parts=[ToolCallPart("echo", {"n": 1}, tool_call_id="c1")])
    folded = ModelRequest(parts=[ToolReturnPart("echo", "r1", tool_call_id="c1")])
    history.append(response)
    first = encoder.encode(encoder.keyed(history, provisional=[folded]))
    assert (first.keep, len(first.new_messages), first.history.settled) == (0, 5, True)
    encoder.commit(0, first)
    stamped = ModelRequest(parts=[ToolReturnPart("echo", "r1", tool_call_id="c1")], run_id="stamped")
    history.append(stamped)
    history.append(ModelResponse(parts=[TextPart("done")]))
    second = encoder.encode(encoder.keyed(history))
    assert (second.base_index, second.keep, len(second.new_messages)) == (0, 4, 2)
    assert second.refs == SnapshotEncoder().keyed(history).refs
    encoder.commit(1, second)
    assert encoder.is_previous(encoder.keyed(history, fresh=True))
    history[1].parts[0].args = {"n": "edited"}
    assert not encoder.is_previous(encoder.keyed(history, fresh=True))


def test_snapshot_round_trip() -> None:
    encoder = SnapshotEncoder()
    delta = encoder.encode(encoder.keyed(_history(1)))
    (snapshot,) = _round_trip(
        _records.snapshot(SCOPE, snapshot_index=0, step_index=2, state="complete", idempotency_key="0:2:complete",
                          base_index=delta.base_index, keep=delta.keep, append_refs=delta.append_refs,
                          new_messages=delta.new_messages)
    )  # fmt: skip
    assert isinstance(snapshot, SnapshotRecord)
    assert snapshot.append_refs == delta.refs and snapshot.messages == delta.new_messages
    assert (snapshot.snapshot_index, snapshot.state, snapshot.base_index, snapshot.keep) == (0, "complete", None, 0)


@pytest.mark.parametrize(
    ("record", "code"),
    [
        (_records.step_event(_records.RunScope("../x", None, None, None), "run_completed", step_index=0,
                             idempotency_key="k"), "bad_run_id"),
        (_records.tool_effect(SCOPE, "exploded", step_index=0, record_key="k", tool_call_id="c", tool_name="t"),
         "bad_attribute"),
    ],
)  # fmt: skip
def test_malformed_records_are_refused_with_a_reason(record, code) -> None:
    decoded, refusals = decode_request(_request(record))
    assert decoded == [] and [r.code for r in refusals] == [code]
    assert refusals[0].line().startswith("record 0 [")


def test_remembered_attributes_encode_as_protobuf_does(monkeypatch) -> None:
    """Attribute fields are remembered by value (`_otlp._recurring`): a later value equal to an earlier one
    of another type (True and 1), a long or non-ASCII string, and a full memory must all still encode as the
    protobuf classes would."""
    monkeypatch.setattr(_otlp, "_recurring", {})
    monkeypatch.setattr(_otlp, "_RECURRING_MAX", 3)
    values = [("n", 1), ("n", True), ("n", 1), ("s", "é" * 300), ("s", "short"), ("n", -5), ("f", 0.5), ("n", 1)]
    values += [("s", None), ("b", b"\x00\x01")]
    record = LogRecord.FromString(_otlp.attributes(values))
    expected = LogRecord(attributes=[KeyValue(key=k, value=_any_value(v)) for k, v in values if v is not None])
    assert record == expected
    assert record.SerializeToString() == _otlp.attributes(values)
    assert len(_otlp._recurring) <= 3


def _any_value(value: object) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    return AnyValue(string_value=value)


def test_message_json_is_plain_utf8_json() -> None:
    encoder = SnapshotEncoder()
    delta = encoder.encode(encoder.keyed([ModelResponse(parts=[TextPart("héllo ✓")])]))
    assert json.loads(delta.new_messages[0])["parts"][0]["content"] == "héllo ✓"


def _settled_by_full_walk(messages: list) -> bool:
    open_calls: set[str] = set()
    return all(answer_calls(open_calls, m) for m in messages) and not open_calls


def test_keyed_history_walks_only_new_messages_and_agrees_with_a_full_walk(monkeypatch) -> None:
    """Growing, folding in a provisional request, rewriting and orphan returns: each answer matches a
    fresh encoder's, while a growing history serialises only its new messages."""
    rng = random.Random(7)
    encoder = SnapshotEncoder()
    history: list = [ModelRequest(parts=[UserPromptPart("hi")])]
    serialised = 0
    original = snapshots_module._key

    def counting_key(message):
        nonlocal serialised
        serialised += 1
        return original(message)

    monkeypatch.setattr(snapshots_module, "_key", counting_key)
    for step in range(60):
        call = f"c{step}"
        history.append(ModelResponse(parts=[ToolCallPart("echo", {"n": step}, tool_call_id=call)]))
        answer = rng.choice(["return", "orphan", "none"]) if step % 10 == 9 else "return"
        answered = call if answer == "return" else f"ghost{step}"
        request = ModelRequest(parts=[ToolReturnPart("echo", "r", tool_call_id=answered)])
        before = serialised
        folded = encoder.keyed(history, provisional=[request])
        # The new response, the provisional request, and last step's request (provisional then): never the history.
        assert serialised - before <= 3
        expected = SnapshotEncoder().keyed([*history, request], fresh=True)
        assert (folded.refs, folded.texts, folded.settled) == (expected.refs, expected.texts, expected.settled)
        assert folded.settled == _settled_by_full_walk([*history, request])
        if answer != "none":
            history.append(request)
        if step == 30:  # a history processor drops the oldest turn: of the kept messages, only the one
            history = [history[0], *history[3:]]  # provisional when last seen is serialised again
            before = serialised
            rewritten = encoder.keyed(history)
            assert serialised - before == 1
            assert rewritten.refs == SnapshotEncoder().keyed(history).refs


def test_keyed_history_sees_in_place_edits_only_when_fresh() -> None:
    encoder = SnapshotEncoder()
    history = _history(2)
    first = encoder.keyed(history)
    history[2].parts[0].content = "edited"
    assert encoder.keyed(history).refs == first.refs  # same objects: taken as unchanged, like any identity cache
    assert encoder.keyed(history, fresh=True).refs != first.refs
