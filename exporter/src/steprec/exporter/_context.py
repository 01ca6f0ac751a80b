"""Async-context state shared by StepRecorder runs in one process."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from pydantic_ai.messages import ModelMessage

if TYPE_CHECKING:
    from ._capability import StepRecorder

active_recording: ContextVar[StepRecorder[Any] | None] = ContextVar("steprec.active_recording", default=None)
"""The per-run StepRecorder of the innermost recorded `Agent.run`.

Set by `wrap_run`; a nested recorder's `for_run` reads it to infer
`parent_run_id` before its own `wrap_run` replaces it, and
`annotate_tool_effect` reads it to find the in-flight tool's run. pydantic-ai's
own run signals are single-slot and already overwritten by then, hence a
variable of steprec's own. Like every ContextVar it follows asyncio tasks.
"""

live_history: ContextVar[tuple[list[ModelMessage], int] | None] = ContextVar("steprec.live_history", default=None)
"""`(live message list, run_step)` refreshed at each node boundary, held by reference.

`on_run_error`'s context carries the start-of-run list, not the live one, so
the error path reads the history the graph was building from here.
"""
