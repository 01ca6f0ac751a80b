"""steprec's in-process half: a pydantic-ai capability that records each step to a steprec recorder.

Light by design: pydantic-ai, the OpenTelemetry SDK and the OTLP gRPC exporter,
nothing else. No database and no pyarrow ever load in an agent process.
"""

from ._capability import DEFAULT_ENDPOINT, StepRecorder, annotate_tool_effect
from ._events import SnapshotSaved
from ._pipeline import shutdown_pipelines

__all__ = ["DEFAULT_ENDPOINT", "SnapshotSaved", "StepRecorder", "annotate_tool_effect", "shutdown_pipelines"]
