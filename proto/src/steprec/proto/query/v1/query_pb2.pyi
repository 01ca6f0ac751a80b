from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("conversation_id", "parent_run_id", "agent_name", "started_at_or_after_unix_nano", "started_before_unix_nano", "outcome", "page_size", "page_token", "forked_from_run_id")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_OR_AFTER_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    STARTED_BEFORE_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    parent_run_id: str
    agent_name: str
    started_at_or_after_unix_nano: int
    started_before_unix_nano: int
    outcome: str
    page_size: int
    page_token: str
    forked_from_run_id: str
    def __init__(self, conversation_id: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., agent_name: _Optional[str] = ..., started_at_or_after_unix_nano: _Optional[int] = ..., started_before_unix_nano: _Optional[int] = ..., outcome: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., forked_from_run_id: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("run_id", "conversation_id", "parent_run_id", "agent_name", "metadata", "started_at_unix_nano", "ended_at_unix_nano", "outcome", "registration_id", "forked_from_run_id", "forked_from_snapshot_index")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    conversation_id: str
    parent_run_id: str
    agent_name: str
    metadata: _containers.ScalarMap[str, str]
    started_at_unix_nano: int
    ended_at_unix_nano: int
    outcome: str
    registration_id: str
    forked_from_run_id: str
    forked_from_snapshot_index: int
    def __init__(self, run_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., agent_name: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., started_at_unix_nano: _Optional[int] = ..., ended_at_unix_nano: _Optional[int] = ..., outcome: _Optional[str] = ..., registration_id: _Optional[str] = ..., forked_from_run_id: _Optional[str] = ..., forked_from_snapshot_index: _Optional[int] = ...) -> None: ...

class GetRunTreeRequest(_message.Message):
    __slots__ = ("run_id", "ancestors")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ANCESTORS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    ancestors: bool
    def __init__(self, run_id: _Optional[str] = ..., ancestors: _Optional[bool] = ...) -> None: ...

class GetRunTreeResponse(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[TreeRun]
    def __init__(self, runs: _Optional[_Iterable[_Union[TreeRun, _Mapping]]] = ...) -> None: ...

class GetDescendantsRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class TreeRun(_message.Message):
    __slots__ = ("run", "depth")
    RUN_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    run: Run
    depth: int
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ..., depth: _Optional[int] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[StepEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[StepEvent, _Mapping]]] = ...) -> None: ...

class StepEvent(_message.Message):
    __slots__ = ("run_id", "kind", "step_index", "timestamp_unix_nano", "conversation_id", "parent_run_id", "agent_name", "tool_call_id", "tool_name", "error", "metadata", "idempotency_key", "trace_id", "span_id")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    kind: str
    step_index: int
    timestamp_unix_nano: int
    conversation_id: str
    parent_run_id: str
    agent_name: str
    tool_call_id: str
    tool_name: str
    error: str
    metadata: _containers.ScalarMap[str, str]
    idempotency_key: str
    trace_id: str
    span_id: str
    def __init__(self, run_id: _Optional[str] = ..., kind: _Optional[str] = ..., step_index: _Optional[int] = ..., timestamp_unix_nano: _Optional[int] = ..., conversation_id: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., agent_name: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., error: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[str] = ..., trace_id: _Optional[str] = ..., span_id: _Optional[str] = ...) -> None: ...

class ReadSnapshotRequest(_message.Message):
    __slots__ = ("run_id", "include_interrupted", "snapshot_index", "digests_only")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_INTERRUPTED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    DIGESTS_ONLY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    include_interrupted: bool
    snapshot_index: int
    digests_only: bool
    def __init__(self, run_id: _Optional[str] = ..., include_interrupted: _Optional[bool] = ..., snapshot_index: _Optional[int] = ..., digests_only: _Optional[bool] = ...) -> None: ...

class ReadMessagesRequest(_message.Message):
    __slots__ = ("digests",)
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    digests: bytes
    def __init__(self, digests: _Optional[bytes] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ("run_id", "include_interrupted")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_INTERRUPTED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    include_interrupted: bool
    def __init__(self, run_id: _Optional[str] = ..., include_interrupted: _Optional[bool] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ("snapshots",)
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[SnapshotInfo]
    def __init__(self, snapshots: _Optional[_Iterable[_Union[SnapshotInfo, _Mapping]]] = ...) -> None: ...

class GetToolEffectRequest(_message.Message):
    __slots__ = ("run_id", "tool_call_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tool_call_id: str
    def __init__(self, run_id: _Optional[str] = ..., tool_call_id: _Optional[str] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("info", "messages_json", "message_piece", "message_complete", "message_digests")
    INFO_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_PIECE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    info: SnapshotInfo
    messages_json: _containers.RepeatedScalarFieldContainer[bytes]
    message_piece: bytes
    message_complete: bool
    message_digests: bytes
    def __init__(self, info: _Optional[_Union[SnapshotInfo, _Mapping]] = ..., messages_json: _Optional[_Iterable[bytes]] = ..., message_piece: _Optional[bytes] = ..., message_complete: _Optional[bool] = ..., message_digests: _Optional[bytes] = ...) -> None: ...

class SnapshotInfo(_message.Message):
    __slots__ = ("run_id", "snapshot_index", "step_index", "state", "timestamp_unix_nano", "conversation_id", "parent_run_id", "agent_name", "idempotency_key", "message_count")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    snapshot_index: int
    step_index: int
    state: str
    timestamp_unix_nano: int
    conversation_id: str
    parent_run_id: str
    agent_name: str
    idempotency_key: str
    message_count: int
    def __init__(self, run_id: _Optional[str] = ..., snapshot_index: _Optional[int] = ..., step_index: _Optional[int] = ..., state: _Optional[str] = ..., timestamp_unix_nano: _Optional[int] = ..., conversation_id: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., agent_name: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., message_count: _Optional[int] = ...) -> None: ...

class ListToolEffectsRequest(_message.Message):
    __slots__ = ("run_id", "unresolved_only")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    UNRESOLVED_ONLY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    unresolved_only: bool
    def __init__(self, run_id: _Optional[str] = ..., unresolved_only: _Optional[bool] = ...) -> None: ...

class ListToolEffectsResponse(_message.Message):
    __slots__ = ("effects",)
    EFFECTS_FIELD_NUMBER: _ClassVar[int]
    effects: _containers.RepeatedCompositeFieldContainer[ToolEffect]
    def __init__(self, effects: _Optional[_Iterable[_Union[ToolEffect, _Mapping]]] = ...) -> None: ...

class ToolEffect(_message.Message):
    __slots__ = ("run_id", "tool_call_id", "tool_name", "status", "started_at_unix_nano", "ended_at_unix_nano", "idempotency_key", "effect_summary")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    EFFECT_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tool_call_id: str
    tool_name: str
    status: str
    started_at_unix_nano: int
    ended_at_unix_nano: int
    idempotency_key: str
    effect_summary: str
    def __init__(self, run_id: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., status: _Optional[str] = ..., started_at_unix_nano: _Optional[int] = ..., ended_at_unix_nano: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., effect_summary: _Optional[str] = ...) -> None: ...

class FetchMediaRequest(_message.Message):
    __slots__ = ("uri",)
    URI_FIELD_NUMBER: _ClassVar[int]
    uri: str
    def __init__(self, uri: _Optional[str] = ...) -> None: ...

class MediaChunk(_message.Message):
    __slots__ = ("data", "size_bytes")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    size_bytes: int
    def __init__(self, data: _Optional[bytes] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class SqlRequest(_message.Message):
    __slots__ = ("query", "max_rows", "timeout_seconds")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    MAX_ROWS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    query: str
    max_rows: int
    timeout_seconds: float
    def __init__(self, query: _Optional[str] = ..., max_rows: _Optional[int] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class ExportViewRequest(_message.Message):
    __slots__ = ("view",)
    VIEW_FIELD_NUMBER: _ClassVar[int]
    view: str
    def __init__(self, view: _Optional[str] = ...) -> None: ...

class ArrowChunk(_message.Message):
    __slots__ = ("arrow_ipc", "batch_end", "truncated")
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    BATCH_END_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    arrow_ipc: bytes
    batch_end: bool
    truncated: bool
    def __init__(self, arrow_ipc: _Optional[bytes] = ..., batch_end: _Optional[bool] = ..., truncated: _Optional[bool] = ...) -> None: ...
