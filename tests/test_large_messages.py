"""Messages far over gRPC's 4 MiB default travel in fragments and come back byte-identical."""

from __future__ import annotations

import os

from pydantic_ai import Agent, BinaryContent
from pydantic_ai.messages import ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import FunctionModel
from steprec.exporter import StepRecorder
from steprec.query import RecorderClient, continue_run
from steprec.recorder.daemon.process import RecorderProcess


async def test_a_50_mb_image_round_trips_without_raising_the_grpc_cap(
    recorder: RecorderProcess, client: RecorderClient
) -> None:
    image = os.urandom(50 * 1024 * 1024)
    agent = Agent(
        FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("a very noisy picture")])),
        capabilities=[StepRecorder(endpoint=recorder.endpoint)],
    )
    await agent.run(["describe this", BinaryContent(data=image, media_type="image/png")], conversation_id="conv-big")
    (run,) = await client.list_runs(conversation_id="conv-big")
    history = await continue_run(client, run_id=run.run_id)
    (prompt,) = [p for p in history[0].parts if isinstance(p, UserPromptPart)]
    restored = prompt.content[1]
    assert isinstance(restored, BinaryContent) and restored.media_type == "image/png"
    assert restored.data == image
    follow_up = await agent.run("and now?", message_history=history)
    assert follow_up.output == "a very noisy picture"
