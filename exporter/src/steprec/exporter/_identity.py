"""Run ids: the step-persistence resolution rules, and the shape every store can hold."""

from __future__ import annotations

import base64
import re

MAX_RUN_ID_LENGTH = 200
_RUN_ID = re.compile(r"[A-Za-z0-9_.-]{1,200}")


def check_run_id(run_id: str, *, what: str = "run_id") -> str:
    """`run_id` unchanged, or `ValueError` naming what is wrong with it.

    The recorder refuses the same shapes, so a bad id fails here, at
    construction, instead of as a refused record later.
    """
    if not isinstance(run_id, str):
        raise ValueError(f"{what} must be a string, got {type(run_id).__name__}")
    if not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"{what} {run_id!r} must be 1-200 characters of A-Z, a-z, 0-9, '_', '.' or '-'")
    if ".." in run_id:
        raise ValueError(f"{what} {run_id!r} must not contain '..'")
    return run_id


def derive_run_id(agent_name: str, context_run_id: str) -> str:
    """`sp-` + unpadded urlsafe base64 of `"{len(name_bytes)}:{name}{context_run_id}"`.

    Identical to pydantic-ai-harness's derivation, so a run recorded by either
    has the same id. The length prefix makes the encoding injective.
    """
    name_bytes = agent_name.encode()
    payload = f"{len(name_bytes)}:{agent_name}{context_run_id}".encode()
    derived = "sp-" + base64.urlsafe_b64encode(payload).decode().rstrip("=")
    if len(derived) > MAX_RUN_ID_LENGTH:
        raise ValueError(
            f"derived StepRecorder run_id is {len(derived)} characters, over the {MAX_RUN_ID_LENGTH}-character "
            "limit; use a shorter agent_name"
        )
    return derived
