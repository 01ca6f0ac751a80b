"""Media blobs on S3-compatible storage: moto's S3 server on 127.0.0.1, started by the test."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer
from pydantic_ai import Agent, BinaryContent
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse, TextPart
from pydantic_ai.models.function import FunctionModel
from steprec.exporter import StepRecorder, shutdown_pipelines
from steprec.query import RecorderClient, continue_run
from steprec.recorder.daemon.process import RecorderProcess


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):  # fmt: skip
        monkeypatch.setenv(name, value)
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="steprec-media")
    try:
        yield endpoint, client
    finally:
        server.stop()


async def test_media_round_trips_through_s3_and_prune_collects_it(
    tmp_path: Path, s3, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, client = s3
    # The recorder gets its credentials from options, not from the environment.
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    (tmp_path / "secret").write_text("testing\n")
    args = ("--media", "s3://steprec-media/blobs", "--s3-endpoint-url", endpoint,
            "--s3-access-key-id", "testing", "--s3-secret-access-key-file", str(tmp_path / "secret"))  # fmt: skip
    recorder = RecorderProcess(tmp_path / "recorder", extra_args=args).start()
    image = os.urandom(300_000)
    try:
        agent = Agent(FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("ok")])),
                      capabilities=[StepRecorder(endpoint=recorder.endpoint, journal_dir=tmp_path / "s")])  # fmt: skip
        result = await agent.run(["see", BinaryContent(data=image, media_type="image/png")], conversation_id="s3")
        async with RecorderClient(recorder.endpoint) as reader:
            history = await continue_run(reader, run_id=result.run_id)
        assert ModelMessagesTypeAdapter.dump_json(history) == ModelMessagesTypeAdapter.dump_json(result.all_messages())
        keys = [o["Key"] for o in client.list_objects_v2(Bucket="steprec-media").get("Contents", [])]
        assert len(keys) == 1 and keys[0].startswith("blobs/")
        assert client.get_object(Bucket="steprec-media", Key=keys[0])["Body"].read() == image
        assert not (tmp_path / "recorder" / "media").exists()

        steprec = str(Path(sys.executable).parent / "steprec")
        pruned = subprocess.run([steprec, "prune", "--endpoint", recorder.endpoint, "--conversation", "s3", "--json"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert pruned.returncode == 0, pruned.stderr
        assert json.loads(pruned.stdout)["media_blobs"] == 1
        assert client.list_objects_v2(Bucket="steprec-media").get("KeyCount") == 0
    finally:
        shutdown_pipelines()
        recorder.stop()


def test_a_missing_bucket_stops_the_recorder_with_a_reason(tmp_path: Path, s3) -> None:
    endpoint, _ = s3
    steprec = str(Path(sys.executable).parent / "steprec")
    result = subprocess.run(
        [steprec, "serve", "--listen", "127.0.0.1:0", "--data", str(tmp_path), "--media", "s3://no-such-bucket",
         "--s3-endpoint-url", endpoint],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1 and "steprec serve:" in result.stderr and "Traceback" not in result.stderr
