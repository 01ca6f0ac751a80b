from steprec.proto.query.v1 import query_pb2 as _query_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GitCheckout(_message.Message):
    __slots__ = ("repository", "name", "root", "branch")
    REPOSITORY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    repository: str
    name: str
    root: str
    branch: str
    def __init__(self, repository: _Optional[str] = ..., name: _Optional[str] = ..., root: _Optional[str] = ..., branch: _Optional[str] = ...) -> None: ...

class ConversationSummary(_message.Message):
    __slots__ = ("schema_version", "id", "workspace", "checkout", "updated_at_unix_nano", "revision", "title", "subtitle", "tags", "title_source", "naming_version", "named_revision", "model", "outcome", "run_id", "owner_pid", "message_count", "total_tokens", "naming_tokens", "archived_at_unix_nano", "owner_host")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    CHECKOUT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    SUBTITLE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TITLE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMING_VERSION_FIELD_NUMBER: _ClassVar[int]
    NAMED_REVISION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_PID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NAMING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_AT_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    OWNER_HOST_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    id: str
    workspace: str
    checkout: GitCheckout
    updated_at_unix_nano: int
    revision: int
    title: str
    subtitle: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    title_source: str
    naming_version: int
    named_revision: int
    model: str
    outcome: str
    run_id: str
    owner_pid: int
    message_count: int
    total_tokens: int
    naming_tokens: int
    archived_at_unix_nano: int
    owner_host: str
    def __init__(self, schema_version: _Optional[int] = ..., id: _Optional[str] = ..., workspace: _Optional[str] = ..., checkout: _Optional[_Union[GitCheckout, _Mapping]] = ..., updated_at_unix_nano: _Optional[int] = ..., revision: _Optional[int] = ..., title: _Optional[str] = ..., subtitle: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., title_source: _Optional[str] = ..., naming_version: _Optional[int] = ..., named_revision: _Optional[int] = ..., model: _Optional[str] = ..., outcome: _Optional[str] = ..., run_id: _Optional[str] = ..., owner_pid: _Optional[int] = ..., message_count: _Optional[int] = ..., total_tokens: _Optional[int] = ..., naming_tokens: _Optional[int] = ..., archived_at_unix_nano: _Optional[int] = ..., owner_host: _Optional[str] = ...) -> None: ...

class SaveConversationRequest(_message.Message):
    __slots__ = ("summary", "message_digests", "messages", "search_text")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SEARCH_TEXT_FIELD_NUMBER: _ClassVar[int]
    summary: ConversationSummary
    message_digests: bytes
    messages: _query_pb2.SnapshotChunk
    search_text: str
    def __init__(self, summary: _Optional[_Union[ConversationSummary, _Mapping]] = ..., message_digests: _Optional[bytes] = ..., messages: _Optional[_Union[_query_pb2.SnapshotChunk, _Mapping]] = ..., search_text: _Optional[str] = ...) -> None: ...

class GetConversationRequest(_message.Message):
    __slots__ = ("conversation_id",)
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    def __init__(self, conversation_id: _Optional[str] = ...) -> None: ...

class GetConversationResponse(_message.Message):
    __slots__ = ("summary", "message_digests")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    summary: ConversationSummary
    message_digests: bytes
    def __init__(self, summary: _Optional[_Union[ConversationSummary, _Mapping]] = ..., message_digests: _Optional[bytes] = ...) -> None: ...

class ListConversationsRequest(_message.Message):
    __slots__ = ("query", "limit", "offset", "archived")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_FIELD_NUMBER: _ClassVar[int]
    query: str
    limit: int
    offset: int
    archived: bool
    def __init__(self, query: _Optional[str] = ..., limit: _Optional[int] = ..., offset: _Optional[int] = ..., archived: _Optional[bool] = ...) -> None: ...

class ListConversationsResponse(_message.Message):
    __slots__ = ("conversations",)
    CONVERSATIONS_FIELD_NUMBER: _ClassVar[int]
    conversations: _containers.RepeatedCompositeFieldContainer[ConversationSummary]
    def __init__(self, conversations: _Optional[_Iterable[_Union[ConversationSummary, _Mapping]]] = ...) -> None: ...

class NameConversationRequest(_message.Message):
    __slots__ = ("source", "title", "subtitle", "tags", "manual", "tokens")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    SUBTITLE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    MANUAL_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    source: ConversationSummary
    title: str
    subtitle: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    manual: bool
    tokens: int
    def __init__(self, source: _Optional[_Union[ConversationSummary, _Mapping]] = ..., title: _Optional[str] = ..., subtitle: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., manual: _Optional[bool] = ..., tokens: _Optional[int] = ...) -> None: ...

class NameConversationResponse(_message.Message):
    __slots__ = ("applied",)
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    def __init__(self, applied: _Optional[bool] = ...) -> None: ...

class SetConversationArchivedRequest(_message.Message):
    __slots__ = ("conversation_id", "archived")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    archived: bool
    def __init__(self, conversation_id: _Optional[str] = ..., archived: _Optional[bool] = ...) -> None: ...

class DeleteConversationRequest(_message.Message):
    __slots__ = ("conversation_id", "revision")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    revision: int
    def __init__(self, conversation_id: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class DeleteConversationResponse(_message.Message):
    __slots__ = ("runs", "messages")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    runs: int
    messages: int
    def __init__(self, runs: _Optional[int] = ..., messages: _Optional[int] = ...) -> None: ...
