from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class PruneRequest(_message.Message):
    __slots__ = ("started_before_unix_nano", "conversation_id", "dry_run")
    STARTED_BEFORE_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    started_before_unix_nano: int
    conversation_id: str
    dry_run: bool
    def __init__(self, started_before_unix_nano: _Optional[int] = ..., conversation_id: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class PruneResponse(_message.Message):
    __slots__ = ("runs", "events", "snapshots", "tool_effects", "messages", "message_bytes", "media_blobs", "media_bytes")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    TOOL_EFFECTS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_BLOBS_FIELD_NUMBER: _ClassVar[int]
    MEDIA_BYTES_FIELD_NUMBER: _ClassVar[int]
    runs: int
    events: int
    snapshots: int
    tool_effects: int
    messages: int
    message_bytes: int
    media_blobs: int
    media_bytes: int
    def __init__(self, runs: _Optional[int] = ..., events: _Optional[int] = ..., snapshots: _Optional[int] = ..., tool_effects: _Optional[int] = ..., messages: _Optional[int] = ..., message_bytes: _Optional[int] = ..., media_blobs: _Optional[int] = ..., media_bytes: _Optional[int] = ...) -> None: ...
