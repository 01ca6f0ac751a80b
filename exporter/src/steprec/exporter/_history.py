"""Classifying histories: is all tool work settled, and is there anything worth resuming."""

from __future__ import annotations

from pydantic_ai.messages import ModelMessage, ModelResponse, RetryPromptPart, ToolCallPart, ToolReturnPart


def is_settled(messages: list[ModelMessage]) -> bool:
    """True when every tool call has exactly one matching return, in order (the reference's `is_provider_valid`).

    A settled history snapshots as `complete`; anything else is `interrupted`.
    A tool-bound `RetryPromptPart` answers its call like a return does.
    """
    open_calls: set[str] = set()
    for message in messages:
        if isinstance(message, ModelResponse):
            open_calls.update(p.tool_call_id for p in message.parts if isinstance(p, ToolCallPart))
            continue
        for part in message.parts:
            answers_call = isinstance(part, ToolReturnPart) or (
                isinstance(part, RetryPromptPart) and part.tool_name is not None
            )
            if answers_call:
                if part.tool_call_id not in open_calls:
                    return False
                open_calls.discard(part.tool_call_id)
    return not open_calls


def has_model_response(messages: list[ModelMessage]) -> bool:
    """A history without a model response is the same as restarting the run: not worth a snapshot."""
    return any(isinstance(message, ModelResponse) for message in messages)
