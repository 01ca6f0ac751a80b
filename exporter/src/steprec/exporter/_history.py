"""Classifying histories: is all tool work settled, and is there anything worth resuming."""

from __future__ import annotations

from pydantic_ai.messages import ModelMessage, ModelResponse, RetryPromptPart, ToolCallPart, ToolReturnPart


def answer_calls(open_calls: set[str], message: ModelMessage) -> bool:
    """Fold one message into the tool calls still open before it; False if it answers a call never made.

    Settledness is the reference's `is_provider_valid`: every tool call has exactly one matching
    return, in order, and a tool-bound `RetryPromptPart` answers its call like a return does. Folding
    one message at a time lets a growing history be checked in the time its new messages take.
    """
    if isinstance(message, ModelResponse):
        open_calls.update(p.tool_call_id for p in message.parts if isinstance(p, ToolCallPart))
        return True
    for part in message.parts:
        if isinstance(part, ToolReturnPart) or (isinstance(part, RetryPromptPart) and part.tool_name is not None):
            if part.tool_call_id not in open_calls:
                return False
            open_calls.discard(part.tool_call_id)
    return True


def has_model_response(messages: list[ModelMessage]) -> bool:
    """A history without a model response is the same as restarting the run: not worth a snapshot."""
    return any(isinstance(message, ModelResponse) for message in messages)
