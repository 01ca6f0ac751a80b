"""Media offload: BinaryContent and large text become content-addressed blobs and come back byte-identical."""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
from pydantic_ai import Agent, BinaryContent
from pydantic_ai.messages import (
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import FunctionModel
from steprec.exporter import StepRecorder, shutdown_pipelines
from steprec.query import RecorderClient, continue_run
from steprec.recorder.daemon.process import RecorderProcess
from steprec.recorder.store.media import MARKER, LocalMediaStore, MediaCodec


def _json(messages) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


def test_codec_round_trips_binary_large_text_and_look_alike_caller_data(tmp_path: Path) -> None:
    codec = MediaCodec(LocalMediaStore(tmp_path / "media"), threshold=1000)
    messages = [
        ModelRequest(parts=[UserPromptPart(["look", BinaryContent(data=os.urandom(300), media_type="image/png")])]),
        ModelRequest(parts=[ToolReturnPart("read", "y" * 5000, tool_call_id="c1")]),
        ModelRequest(parts=[ToolReturnPart("raw", {MARKER: {"uri": "media+sha256://" + "0" * 64}}, tool_call_id="c2")]),
        ModelResponse(parts=[TextPart("short")]),
    ]
    for message in messages:
        original = ModelMessagesTypeAdapter.dump_json([message])[1:-1].decode()
        stored, _ = codec.externalize(original)
        restored = codec.restore(stored)
        assert _json(ModelMessagesTypeAdapter.validate_json(f"[{restored}]")) == _json([message])
    binary_original = ModelMessagesTypeAdapter.dump_json(messages[:1])[1:-1].decode()
    binary_stored, offloaded = codec.externalize(binary_original)
    data = json.loads(binary_original)["parts"][0]["content"][1]["data"]
    assert MARKER in binary_stored and data not in binary_stored
    assert [size for _, size in offloaded] == [300]
    text_stored, _ = codec.externalize(ModelMessagesTypeAdapter.dump_json(messages[1:2])[1:-1].decode())
    assert "yyyy" not in text_stored
    assert len(list((tmp_path / "media").glob("??/*"))) == 2
    assert all(p.stat().st_mode & 0o077 == 0 for p in (tmp_path / "media").glob("??/*"))


async def test_media_is_stored_once_outside_duckdb_and_restored(tmp_path: Path) -> None:
    image = os.urandom(200_000)
    big_text = "log line\n" * 10_000  # 90 KB: over the 64 KiB threshold

    def model(messages, info):
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("read_log", {})])
        return ModelResponse(parts=[TextPart("seen")])

    recorder = RecorderProcess(tmp_path / "recorder").start()
    try:
        agent = Agent(
            FunctionModel(model), capabilities=[StepRecorder(endpoint=recorder.endpoint, journal_dir=tmp_path / "s")]
        )

        @agent.tool_plain
        def read_log() -> str:
            return big_text  # a string tool return over the threshold

        first = await agent.run(["a", BinaryContent(data=image, media_type="image/png")], conversation_id="m1")
        second = await agent.run(["b", BinaryContent(data=image, media_type="image/png")], conversation_id="m2")
        async with RecorderClient(recorder.endpoint) as client:
            for result in (first, second):
                history = await continue_run(client, run_id=result.run_id)
                assert _json(history) == _json(result.all_messages())
    finally:
        shutdown_pipelines()
        recorder.stop()
    blobs = list((tmp_path / "recorder" / "media").glob("??/*"))
    assert sorted(p.stat().st_size for p in blobs) == sorted([len(image), len(big_text)])  # the image once
    with duckdb.connect(str(tmp_path / "recorder" / "steprec.duckdb"), read_only=True) as db:
        largest = db.execute("SELECT max(octet_length(body::BLOB)) FROM messages").fetchone()[0]
        refs = db.execute("SELECT count(*), count(DISTINCT uri) FROM media_refs").fetchone()
    assert largest < 5_000
    # Two distinct blobs; at least two messages refer to the image and one to the log text (a
    # folded-in tool-return request is stored in its unstamped and stamped versions).
    assert refs[1] == 2 and refs[0] >= 3
    files = [p for p in (tmp_path / "recorder").rglob("*") if p.is_file()]
    assert files and all(p.stat().st_mode & 0o077 == 0 for p in files), "every file the recorder made is owner-only"


async def test_prune_collects_blobs_nothing_refers_to(tmp_path: Path) -> None:
    import subprocess
    import sys

    recorder = RecorderProcess(tmp_path / "recorder").start()
    try:
        agent = Agent(FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("ok")])),
                      capabilities=[StepRecorder(endpoint=recorder.endpoint, journal_dir=tmp_path / "s")])  # fmt: skip
        await agent.run(["x", BinaryContent(data=os.urandom(5000), media_type="image/png")], conversation_id="gone")
        await agent.run(["y", BinaryContent(data=os.urandom(5000), media_type="image/png")], conversation_id="kept")
        steprec = str(Path(sys.executable).parent / "steprec")
        result = subprocess.run([steprec, "prune", "--endpoint", recorder.endpoint, "--conversation", "gone", "--json"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["media_blobs"] == 1
        assert len(list((tmp_path / "recorder" / "media").glob("??/*"))) == 1
        async with RecorderClient(recorder.endpoint) as client:
            (kept,) = await client.list_runs(conversation_id="kept")
            history = await continue_run(client, run_id=kept.run_id)
            assert isinstance(history[0].parts[0].content[1], BinaryContent)
    finally:
        shutdown_pipelines()
        recorder.stop()
