from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Format(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FORMAT_UNSPECIFIED: _ClassVar[Format]
    FORMAT_NEUTRAL: _ClassVar[Format]
    FORMAT_OPENAI_CHAT: _ClassVar[Format]
    FORMAT_ANTHROPIC_MESSAGES: _ClassVar[Format]

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_SYSTEM: _ClassVar[Role]
    ROLE_DEVELOPER: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]
    ROLE_TOOL: _ClassVar[Role]

class Expose(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPOSE_UNSPECIFIED: _ClassVar[Expose]
    EXPOSE_IO: _ClassVar[Expose]
    EXPOSE_FULL: _ClassVar[Expose]
    EXPOSE_NONE: _ClassVar[Expose]

class FunctionStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FUNCTION_STATUS_UNSPECIFIED: _ClassVar[FunctionStatus]
    FUNCTION_STATUS_COMPLETED: _ClassVar[FunctionStatus]
    FUNCTION_STATUS_ERROR: _ClassVar[FunctionStatus]

class NodeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_KIND_UNSPECIFIED: _ClassVar[NodeKind]
    NODE_KIND_MESSAGE: _ClassVar[NodeKind]
    NODE_KIND_TOOL_RESULT: _ClassVar[NodeKind]
    NODE_KIND_FUNCTION_CALL: _ClassVar[NodeKind]
    NODE_KIND_FUNCTION_RESULT: _ClassVar[NodeKind]

class Callers(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CALLERS_UNSPECIFIED: _ClassVar[Callers]
    CALLERS_ALL: _ClassVar[Callers]
    CALLERS_NONE: _ClassVar[Callers]

class Reasoning(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REASONING_UNSPECIFIED: _ClassVar[Reasoning]
    REASONING_KEEP: _ClassVar[Reasoning]
    REASONING_DROP: _ClassVar[Reasoning]

class MicrocompactMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MICROCOMPACT_MODE_UNSPECIFIED: _ClassVar[MicrocompactMode]
    MICROCOMPACT_MODE_STEPPED: _ClassVar[MicrocompactMode]
    MICROCOMPACT_MODE_OVER_BUDGET: _ClassVar[MicrocompactMode]

class SummaryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUMMARY_KIND_UNSPECIFIED: _ClassVar[SummaryKind]
    SUMMARY_KIND_ROLLING: _ClassVar[SummaryKind]
    SUMMARY_KIND_SEGMENT: _ClassVar[SummaryKind]

class CompactionReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPACTION_REASON_UNSPECIFIED: _ClassVar[CompactionReason]
    COMPACTION_REASON_APPLIED: _ClassVar[CompactionReason]
    COMPACTION_REASON_EMPTY: _ClassVar[CompactionReason]
    COMPACTION_REASON_NO_GAIN: _ClassVar[CompactionReason]
    COMPACTION_REASON_STALE: _ClassVar[CompactionReason]
    COMPACTION_REASON_CANCELLED: _ClassVar[CompactionReason]
    COMPACTION_REASON_FAILED: _ClassVar[CompactionReason]
    COMPACTION_REASON_NOT_NEEDED: _ClassVar[CompactionReason]

class SummaryRequestForm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUMMARY_REQUEST_FORM_UNSPECIFIED: _ClassVar[SummaryRequestForm]
    SUMMARY_REQUEST_FORM_CACHE_SHARING: _ClassVar[SummaryRequestForm]
    SUMMARY_REQUEST_FORM_RANGE: _ClassVar[SummaryRequestForm]

class ImportFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMPORT_FORMAT_UNSPECIFIED: _ClassVar[ImportFormat]
    IMPORT_FORMAT_NEUTRAL_JSONL: _ClassVar[ImportFormat]
    IMPORT_FORMAT_CLAUDE_CODE_JSONL: _ClassVar[ImportFormat]
    IMPORT_FORMAT_OPENAI_MESSAGES: _ClassVar[ImportFormat]
    IMPORT_FORMAT_CTXD_JSONL: _ClassVar[ImportFormat]

class ExportFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPORT_FORMAT_UNSPECIFIED: _ClassVar[ExportFormat]
    EXPORT_FORMAT_CTXD_JSONL: _ClassVar[ExportFormat]
    EXPORT_FORMAT_OPENAI_MESSAGES: _ClassVar[ExportFormat]
    EXPORT_FORMAT_CLAUDE_CODE_JSONL: _ClassVar[ExportFormat]
FORMAT_UNSPECIFIED: Format
FORMAT_NEUTRAL: Format
FORMAT_OPENAI_CHAT: Format
FORMAT_ANTHROPIC_MESSAGES: Format
ROLE_UNSPECIFIED: Role
ROLE_SYSTEM: Role
ROLE_DEVELOPER: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
ROLE_TOOL: Role
EXPOSE_UNSPECIFIED: Expose
EXPOSE_IO: Expose
EXPOSE_FULL: Expose
EXPOSE_NONE: Expose
FUNCTION_STATUS_UNSPECIFIED: FunctionStatus
FUNCTION_STATUS_COMPLETED: FunctionStatus
FUNCTION_STATUS_ERROR: FunctionStatus
NODE_KIND_UNSPECIFIED: NodeKind
NODE_KIND_MESSAGE: NodeKind
NODE_KIND_TOOL_RESULT: NodeKind
NODE_KIND_FUNCTION_CALL: NodeKind
NODE_KIND_FUNCTION_RESULT: NodeKind
CALLERS_UNSPECIFIED: Callers
CALLERS_ALL: Callers
CALLERS_NONE: Callers
REASONING_UNSPECIFIED: Reasoning
REASONING_KEEP: Reasoning
REASONING_DROP: Reasoning
MICROCOMPACT_MODE_UNSPECIFIED: MicrocompactMode
MICROCOMPACT_MODE_STEPPED: MicrocompactMode
MICROCOMPACT_MODE_OVER_BUDGET: MicrocompactMode
SUMMARY_KIND_UNSPECIFIED: SummaryKind
SUMMARY_KIND_ROLLING: SummaryKind
SUMMARY_KIND_SEGMENT: SummaryKind
COMPACTION_REASON_UNSPECIFIED: CompactionReason
COMPACTION_REASON_APPLIED: CompactionReason
COMPACTION_REASON_EMPTY: CompactionReason
COMPACTION_REASON_NO_GAIN: CompactionReason
COMPACTION_REASON_STALE: CompactionReason
COMPACTION_REASON_CANCELLED: CompactionReason
COMPACTION_REASON_FAILED: CompactionReason
COMPACTION_REASON_NOT_NEEDED: CompactionReason
SUMMARY_REQUEST_FORM_UNSPECIFIED: SummaryRequestForm
SUMMARY_REQUEST_FORM_CACHE_SHARING: SummaryRequestForm
SUMMARY_REQUEST_FORM_RANGE: SummaryRequestForm
IMPORT_FORMAT_UNSPECIFIED: ImportFormat
IMPORT_FORMAT_NEUTRAL_JSONL: ImportFormat
IMPORT_FORMAT_CLAUDE_CODE_JSONL: ImportFormat
IMPORT_FORMAT_OPENAI_MESSAGES: ImportFormat
IMPORT_FORMAT_CTXD_JSONL: ImportFormat
EXPORT_FORMAT_UNSPECIFIED: ExportFormat
EXPORT_FORMAT_CTXD_JSONL: ExportFormat
EXPORT_FORMAT_OPENAI_MESSAGES: ExportFormat
EXPORT_FORMAT_CLAUDE_CODE_JSONL: ExportFormat

class Session(_message.Message):
    __slots__ = ("session_id", "created_at_unix_ms", "metadata", "compaction_count", "branches", "gateway", "node_count")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_COUNT_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    NODE_COUNT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    created_at_unix_ms: int
    metadata: _containers.ScalarMap[str, str]
    compaction_count: int
    branches: _containers.RepeatedCompositeFieldContainer[Branch]
    gateway: GatewayUsage
    node_count: int
    def __init__(self, session_id: _Optional[str] = ..., created_at_unix_ms: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., compaction_count: _Optional[int] = ..., branches: _Optional[_Iterable[_Union[Branch, _Mapping]]] = ..., gateway: _Optional[_Union[GatewayUsage, _Mapping]] = ..., node_count: _Optional[int] = ...) -> None: ...

class GatewayUsage(_message.Message):
    __slots__ = ("calls", "client_tokens", "forwarded_tokens", "input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORWARDED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_READ_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    calls: int
    client_tokens: int
    forwarded_tokens: int
    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    output_tokens: int
    def __init__(self, calls: _Optional[int] = ..., client_tokens: _Optional[int] = ..., forwarded_tokens: _Optional[int] = ..., input_tokens: _Optional[int] = ..., cache_read_tokens: _Optional[int] = ..., cache_write_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class ListGatewayCallsRequest(_message.Message):
    __slots__ = ("session_id", "page_size", "page_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    page_size: int
    page_token: str
    def __init__(self, session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListGatewayCallsResponse(_message.Message):
    __slots__ = ("calls", "next_page_token")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[GatewayCall]
    next_page_token: str
    def __init__(self, calls: _Optional[_Iterable[_Union[GatewayCall, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GatewayCall(_message.Message):
    __slots__ = ("at_unix_ms", "api", "model", "client_tokens", "forwarded_tokens", "input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens", "kept_tokens", "change", "unexplained_miss", "priced_by", "edit_clear", "edit_keep", "provider_cleared", "provider_cleared_tokens", "provider_thinking_dropped", "thinking_dropped", "cost")
    AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    API_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORWARDED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_READ_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KEPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    UNEXPLAINED_MISS_FIELD_NUMBER: _ClassVar[int]
    PRICED_BY_FIELD_NUMBER: _ClassVar[int]
    EDIT_CLEAR_FIELD_NUMBER: _ClassVar[int]
    EDIT_KEEP_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_CLEARED_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_CLEARED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_THINKING_DROPPED_FIELD_NUMBER: _ClassVar[int]
    THINKING_DROPPED_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    at_unix_ms: int
    api: str
    model: str
    client_tokens: int
    forwarded_tokens: int
    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    output_tokens: int
    kept_tokens: int
    change: str
    unexplained_miss: bool
    priced_by: str
    edit_clear: int
    edit_keep: int
    provider_cleared: int
    provider_cleared_tokens: int
    provider_thinking_dropped: int
    thinking_dropped: int
    cost: float
    def __init__(self, at_unix_ms: _Optional[int] = ..., api: _Optional[str] = ..., model: _Optional[str] = ..., client_tokens: _Optional[int] = ..., forwarded_tokens: _Optional[int] = ..., input_tokens: _Optional[int] = ..., cache_read_tokens: _Optional[int] = ..., cache_write_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., kept_tokens: _Optional[int] = ..., change: _Optional[str] = ..., unexplained_miss: _Optional[bool] = ..., priced_by: _Optional[str] = ..., edit_clear: _Optional[int] = ..., edit_keep: _Optional[int] = ..., provider_cleared: _Optional[int] = ..., provider_cleared_tokens: _Optional[int] = ..., provider_thinking_dropped: _Optional[int] = ..., thinking_dropped: _Optional[int] = ..., cost: _Optional[float] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("metadata", "idempotency_key")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    metadata: _containers.ScalarMap[str, str]
    idempotency_key: str
    def __init__(self, metadata: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "id_prefix", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    id_prefix: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., id_prefix: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[Session]
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[Session, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class Branch(_message.Message):
    __slots__ = ("name", "head_id", "head_hash", "updated_at_unix_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HEAD_ID_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    head_id: str
    head_hash: str
    updated_at_unix_ms: int
    def __init__(self, name: _Optional[str] = ..., head_id: _Optional[str] = ..., head_hash: _Optional[str] = ..., updated_at_unix_ms: _Optional[int] = ...) -> None: ...

class CreateBranchRequest(_message.Message):
    __slots__ = ("session_id", "name", "from_node_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    name: str
    from_node_id: str
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ..., from_node_id: _Optional[str] = ...) -> None: ...

class ListBranchesRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ListBranchesResponse(_message.Message):
    __slots__ = ("branches",)
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    branches: _containers.RepeatedCompositeFieldContainer[Branch]
    def __init__(self, branches: _Optional[_Iterable[_Union[Branch, _Mapping]]] = ...) -> None: ...

class DeleteBranchRequest(_message.Message):
    __slots__ = ("session_id", "name")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    name: str
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteBranchResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResetBranchRequest(_message.Message):
    __slots__ = ("session_id", "name", "to_node_id", "expected_head_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HEAD_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    name: str
    to_node_id: str
    expected_head_id: str
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ..., to_node_id: _Optional[str] = ..., expected_head_id: _Optional[str] = ...) -> None: ...

class ContentPart(_message.Message):
    __slots__ = ("text", "media")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    text: str
    media: Media
    def __init__(self, text: _Optional[str] = ..., media: _Optional[_Union[Media, _Mapping]] = ...) -> None: ...

class Media(_message.Message):
    __slots__ = ("mime_type", "data", "url")
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    mime_type: str
    data: bytes
    url: str
    def __init__(self, mime_type: _Optional[str] = ..., data: _Optional[bytes] = ..., url: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("call_id", "name", "arguments_json")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    arguments_json: str
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "parts", "tool_calls")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    role: Role
    parts: _containers.RepeatedCompositeFieldContainer[ContentPart]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., parts: _Optional[_Iterable[_Union[ContentPart, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("call_id", "name", "parts", "is_error")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    parts: _containers.RepeatedCompositeFieldContainer[ContentPart]
    is_error: bool
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., parts: _Optional[_Iterable[_Union[ContentPart, _Mapping]]] = ..., is_error: _Optional[bool] = ...) -> None: ...

class FunctionCall(_message.Message):
    __slots__ = ("call_id", "name", "input", "expose")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    EXPOSE_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    input: str
    expose: Expose
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., input: _Optional[str] = ..., expose: _Optional[_Union[Expose, str]] = ...) -> None: ...

class FunctionResult(_message.Message):
    __slots__ = ("call_id", "output", "status", "function_id", "chain_head_id")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_HEAD_ID_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    output: str
    status: FunctionStatus
    function_id: str
    chain_head_id: str
    def __init__(self, call_id: _Optional[str] = ..., output: _Optional[str] = ..., status: _Optional[_Union[FunctionStatus, str]] = ..., function_id: _Optional[str] = ..., chain_head_id: _Optional[str] = ...) -> None: ...

class NodeInput(_message.Message):
    __slots__ = ("message", "tool_result", "function_call", "function_result", "pinned")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULT_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_CALL_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_RESULT_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    message: Message
    tool_result: ToolResult
    function_call: FunctionCall
    function_result: FunctionResult
    pinned: bool
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ..., tool_result: _Optional[_Union[ToolResult, _Mapping]] = ..., function_call: _Optional[_Union[FunctionCall, _Mapping]] = ..., function_result: _Optional[_Union[FunctionResult, _Mapping]] = ..., pinned: _Optional[bool] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("node_id", "parent_id", "kind", "content", "created_at_unix_ms", "hash", "function_id", "pinned")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    parent_id: str
    kind: NodeKind
    content: NodeInput
    created_at_unix_ms: int
    hash: str
    function_id: str
    pinned: bool
    def __init__(self, node_id: _Optional[str] = ..., parent_id: _Optional[str] = ..., kind: _Optional[_Union[NodeKind, str]] = ..., content: _Optional[_Union[NodeInput, _Mapping]] = ..., created_at_unix_ms: _Optional[int] = ..., hash: _Optional[str] = ..., function_id: _Optional[str] = ..., pinned: _Optional[bool] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("session_id", "branch", "function_id", "expected_head_id", "idempotency_key", "nodes")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HEAD_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    branch: str
    function_id: str
    expected_head_id: str
    idempotency_key: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInput]
    def __init__(self, session_id: _Optional[str] = ..., branch: _Optional[str] = ..., function_id: _Optional[str] = ..., expected_head_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeInput, _Mapping]]] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("node_ids", "head_id", "head_hash")
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    HEAD_ID_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    head_id: str
    head_hash: str
    def __init__(self, node_ids: _Optional[_Iterable[str]] = ..., head_id: _Optional[str] = ..., head_hash: _Optional[str] = ...) -> None: ...

class AppendStreamResponse(_message.Message):
    __slots__ = ("first", "appends")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    APPENDS_FIELD_NUMBER: _ClassVar[int]
    first: int
    appends: _containers.RepeatedCompositeFieldContainer[AppendResponse]
    def __init__(self, first: _Optional[int] = ..., appends: _Optional[_Iterable[_Union[AppendResponse, _Mapping]]] = ...) -> None: ...

class GetNodesRequest(_message.Message):
    __slots__ = ("session_id", "node_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., node_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class LogRequest(_message.Message):
    __slots__ = ("session_id", "branch", "node_id", "limit", "page_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    branch: str
    node_id: str
    limit: int
    page_token: str
    def __init__(self, session_id: _Optional[str] = ..., branch: _Optional[str] = ..., node_id: _Optional[str] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class LogResponse(_message.Message):
    __slots__ = ("nodes", "next_page_token")
    NODES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    next_page_token: str
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RenderRequest(_message.Message):
    __slots__ = ("session_id", "branch", "node_id", "function_id", "tokenizer", "callers", "budget", "policy", "now_unix_ms", "format", "strict_format", "last_call_unix_ms", "model")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    CALLERS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    NOW_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    STRICT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    LAST_CALL_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    branch: str
    node_id: str
    function_id: str
    tokenizer: str
    callers: Callers
    budget: Budget
    policy: RenderPolicy
    now_unix_ms: int
    format: Format
    strict_format: bool
    last_call_unix_ms: int
    model: str
    def __init__(self, session_id: _Optional[str] = ..., branch: _Optional[str] = ..., node_id: _Optional[str] = ..., function_id: _Optional[str] = ..., tokenizer: _Optional[str] = ..., callers: _Optional[_Union[Callers, str]] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., policy: _Optional[_Union[RenderPolicy, _Mapping]] = ..., now_unix_ms: _Optional[int] = ..., format: _Optional[_Union[Format, str]] = ..., strict_format: _Optional[bool] = ..., last_call_unix_ms: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class Budget(_message.Message):
    __slots__ = ("context_window", "output_reserve", "system_tokens", "tools_tokens", "schema_tokens")
    CONTEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_RESERVE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_TOKENS_FIELD_NUMBER: _ClassVar[int]
    context_window: int
    output_reserve: int
    system_tokens: int
    tools_tokens: int
    schema_tokens: int
    def __init__(self, context_window: _Optional[int] = ..., output_reserve: _Optional[int] = ..., system_tokens: _Optional[int] = ..., tools_tokens: _Optional[int] = ..., schema_tokens: _Optional[int] = ...) -> None: ...

class RenderPolicy(_message.Message):
    __slots__ = ("max_tool_result_chars", "microcompact_first", "microcompact_every", "microcompact_keep", "idle_minutes", "retain_turns", "snip", "reactive", "microcompact", "recent_tool_result_chars", "clear_at_least_tokens", "max_tool_input_chars", "max_assistant_text_chars", "recent_assistant_text_chars", "recent_tool_input_chars", "payback_odds", "cache_read_price", "cache_write_price", "reasoning")
    MAX_TOOL_RESULT_CHARS_FIELD_NUMBER: _ClassVar[int]
    MICROCOMPACT_FIRST_FIELD_NUMBER: _ClassVar[int]
    MICROCOMPACT_EVERY_FIELD_NUMBER: _ClassVar[int]
    MICROCOMPACT_KEEP_FIELD_NUMBER: _ClassVar[int]
    IDLE_MINUTES_FIELD_NUMBER: _ClassVar[int]
    RETAIN_TURNS_FIELD_NUMBER: _ClassVar[int]
    SNIP_FIELD_NUMBER: _ClassVar[int]
    REACTIVE_FIELD_NUMBER: _ClassVar[int]
    MICROCOMPACT_FIELD_NUMBER: _ClassVar[int]
    RECENT_TOOL_RESULT_CHARS_FIELD_NUMBER: _ClassVar[int]
    CLEAR_AT_LEAST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_INPUT_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_ASSISTANT_TEXT_CHARS_FIELD_NUMBER: _ClassVar[int]
    RECENT_ASSISTANT_TEXT_CHARS_FIELD_NUMBER: _ClassVar[int]
    RECENT_TOOL_INPUT_CHARS_FIELD_NUMBER: _ClassVar[int]
    PAYBACK_ODDS_FIELD_NUMBER: _ClassVar[int]
    CACHE_READ_PRICE_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITE_PRICE_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    max_tool_result_chars: int
    microcompact_first: int
    microcompact_every: int
    microcompact_keep: int
    idle_minutes: int
    retain_turns: int
    snip: bool
    reactive: bool
    microcompact: MicrocompactMode
    recent_tool_result_chars: int
    clear_at_least_tokens: int
    max_tool_input_chars: int
    max_assistant_text_chars: int
    recent_assistant_text_chars: int
    recent_tool_input_chars: int
    payback_odds: int
    cache_read_price: float
    cache_write_price: float
    reasoning: Reasoning
    def __init__(self, max_tool_result_chars: _Optional[int] = ..., microcompact_first: _Optional[int] = ..., microcompact_every: _Optional[int] = ..., microcompact_keep: _Optional[int] = ..., idle_minutes: _Optional[int] = ..., retain_turns: _Optional[int] = ..., snip: _Optional[bool] = ..., reactive: _Optional[bool] = ..., microcompact: _Optional[_Union[MicrocompactMode, str]] = ..., recent_tool_result_chars: _Optional[int] = ..., clear_at_least_tokens: _Optional[int] = ..., max_tool_input_chars: _Optional[int] = ..., max_assistant_text_chars: _Optional[int] = ..., recent_assistant_text_chars: _Optional[int] = ..., recent_tool_input_chars: _Optional[int] = ..., payback_odds: _Optional[int] = ..., cache_read_price: _Optional[float] = ..., cache_write_price: _Optional[float] = ..., reasoning: _Optional[_Union[Reasoning, str]] = ...) -> None: ...

class RenderedMessage(_message.Message):
    __slots__ = ("role", "parts", "tool_calls", "tool_call_id", "name", "is_error", "node_ids", "function_id", "tokens", "truncated", "cleared", "inputs_stubbed", "pinned")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    INPUTS_STUBBED_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    role: Role
    parts: _containers.RepeatedCompositeFieldContainer[ContentPart]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    name: str
    is_error: bool
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    function_id: str
    tokens: int
    truncated: bool
    cleared: bool
    inputs_stubbed: int
    pinned: bool
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., parts: _Optional[_Iterable[_Union[ContentPart, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., name: _Optional[str] = ..., is_error: _Optional[bool] = ..., node_ids: _Optional[_Iterable[str]] = ..., function_id: _Optional[str] = ..., tokens: _Optional[int] = ..., truncated: _Optional[bool] = ..., cleared: _Optional[bool] = ..., inputs_stubbed: _Optional[int] = ..., pinned: _Optional[bool] = ...) -> None: ...

class RenderResponse(_message.Message):
    __slots__ = ("messages", "head_id", "head_hash", "total_tokens", "tokenizer", "report", "messages_json", "uncarried", "betas")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    HEAD_ID_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    UNCARRIED_FIELD_NUMBER: _ClassVar[int]
    BETAS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[RenderedMessage]
    head_id: str
    head_hash: str
    total_tokens: int
    tokenizer: str
    report: ContextReport
    messages_json: str
    uncarried: _containers.RepeatedCompositeFieldContainer[UncarriedPart]
    betas: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, messages: _Optional[_Iterable[_Union[RenderedMessage, _Mapping]]] = ..., head_id: _Optional[str] = ..., head_hash: _Optional[str] = ..., total_tokens: _Optional[int] = ..., tokenizer: _Optional[str] = ..., report: _Optional[_Union[ContextReport, _Mapping]] = ..., messages_json: _Optional[str] = ..., uncarried: _Optional[_Iterable[_Union[UncarriedPart, _Mapping]]] = ..., betas: _Optional[_Iterable[str]] = ...) -> None: ...

class UncarriedPart(_message.Message):
    __slots__ = ("node_id", "part_index", "mime_type")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PART_INDEX_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    part_index: int
    mime_type: str
    def __init__(self, node_id: _Optional[str] = ..., part_index: _Optional[int] = ..., mime_type: _Optional[str] = ...) -> None: ...

class ContextStatsRequest(_message.Message):
    __slots__ = ("session_id", "branch", "node_id", "function_id", "tokenizer", "callers", "budget", "policy", "now_unix_ms", "last_call_unix_ms", "model")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    CALLERS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    NOW_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_CALL_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    branch: str
    node_id: str
    function_id: str
    tokenizer: str
    callers: Callers
    budget: Budget
    policy: RenderPolicy
    now_unix_ms: int
    last_call_unix_ms: int
    model: str
    def __init__(self, session_id: _Optional[str] = ..., branch: _Optional[str] = ..., node_id: _Optional[str] = ..., function_id: _Optional[str] = ..., tokenizer: _Optional[str] = ..., callers: _Optional[_Union[Callers, str]] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., policy: _Optional[_Union[RenderPolicy, _Mapping]] = ..., now_unix_ms: _Optional[int] = ..., last_call_unix_ms: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class TokenBreakdown(_message.Message):
    __slots__ = ("system", "user", "assistant_text", "tool_calls", "tool_results", "summaries", "markers")
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ASSISTANT_TEXT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULTS_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    system: int
    user: int
    assistant_text: int
    tool_calls: int
    tool_results: int
    summaries: int
    markers: int
    def __init__(self, system: _Optional[int] = ..., user: _Optional[int] = ..., assistant_text: _Optional[int] = ..., tool_calls: _Optional[int] = ..., tool_results: _Optional[int] = ..., summaries: _Optional[int] = ..., markers: _Optional[int] = ...) -> None: ...

class ContextReport(_message.Message):
    __slots__ = ("total_tokens", "tokens", "messages", "tokenizer", "budget", "history_budget", "fits", "over_by", "summary_needed", "results_truncated", "truncated_node_ids", "results_cleared", "cleared_node_ids", "turns_snipped", "snipped_node_ids", "microcompact_trigger", "microcompact_boundary", "stable_prefix_messages", "inputs_stubbed", "stubbed_node_ids", "saved_truncation", "saved_clearing", "saved_stubbing", "pinned_tokens", "pinned_node_ids", "pins_exceed_budget", "summary_ids", "texts_cut", "text_cut_node_ids", "saved_text_cut", "payback_calls", "priced_by", "edit_clear", "edit_keep", "thinking_dropped")
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    HISTORY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    FITS_FIELD_NUMBER: _ClassVar[int]
    OVER_BY_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_NEEDED_FIELD_NUMBER: _ClassVar[int]
    RESULTS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_CLEARED_FIELD_NUMBER: _ClassVar[int]
    CLEARED_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    TURNS_SNIPPED_FIELD_NUMBER: _ClassVar[int]
    SNIPPED_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    MICROCOMPACT_TRIGGER_FIELD_NUMBER: _ClassVar[int]
    MICROCOMPACT_BOUNDARY_FIELD_NUMBER: _ClassVar[int]
    STABLE_PREFIX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    INPUTS_STUBBED_FIELD_NUMBER: _ClassVar[int]
    STUBBED_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    SAVED_TRUNCATION_FIELD_NUMBER: _ClassVar[int]
    SAVED_CLEARING_FIELD_NUMBER: _ClassVar[int]
    SAVED_STUBBING_FIELD_NUMBER: _ClassVar[int]
    PINNED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PINNED_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    PINS_EXCEED_BUDGET_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXTS_CUT_FIELD_NUMBER: _ClassVar[int]
    TEXT_CUT_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    SAVED_TEXT_CUT_FIELD_NUMBER: _ClassVar[int]
    PAYBACK_CALLS_FIELD_NUMBER: _ClassVar[int]
    PRICED_BY_FIELD_NUMBER: _ClassVar[int]
    EDIT_CLEAR_FIELD_NUMBER: _ClassVar[int]
    EDIT_KEEP_FIELD_NUMBER: _ClassVar[int]
    THINKING_DROPPED_FIELD_NUMBER: _ClassVar[int]
    total_tokens: int
    tokens: TokenBreakdown
    messages: int
    tokenizer: str
    budget: Budget
    history_budget: int
    fits: bool
    over_by: int
    summary_needed: bool
    results_truncated: int
    truncated_node_ids: _containers.RepeatedScalarFieldContainer[str]
    results_cleared: int
    cleared_node_ids: _containers.RepeatedScalarFieldContainer[str]
    turns_snipped: int
    snipped_node_ids: _containers.RepeatedScalarFieldContainer[str]
    microcompact_trigger: str
    microcompact_boundary: int
    stable_prefix_messages: int
    inputs_stubbed: int
    stubbed_node_ids: _containers.RepeatedScalarFieldContainer[str]
    saved_truncation: StepSavings
    saved_clearing: StepSavings
    saved_stubbing: StepSavings
    pinned_tokens: int
    pinned_node_ids: _containers.RepeatedScalarFieldContainer[str]
    pins_exceed_budget: bool
    summary_ids: _containers.RepeatedScalarFieldContainer[str]
    texts_cut: int
    text_cut_node_ids: _containers.RepeatedScalarFieldContainer[str]
    saved_text_cut: StepSavings
    payback_calls: int
    priced_by: str
    edit_clear: int
    edit_keep: int
    thinking_dropped: int
    def __init__(self, total_tokens: _Optional[int] = ..., tokens: _Optional[_Union[TokenBreakdown, _Mapping]] = ..., messages: _Optional[int] = ..., tokenizer: _Optional[str] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., history_budget: _Optional[int] = ..., fits: _Optional[bool] = ..., over_by: _Optional[int] = ..., summary_needed: _Optional[bool] = ..., results_truncated: _Optional[int] = ..., truncated_node_ids: _Optional[_Iterable[str]] = ..., results_cleared: _Optional[int] = ..., cleared_node_ids: _Optional[_Iterable[str]] = ..., turns_snipped: _Optional[int] = ..., snipped_node_ids: _Optional[_Iterable[str]] = ..., microcompact_trigger: _Optional[str] = ..., microcompact_boundary: _Optional[int] = ..., stable_prefix_messages: _Optional[int] = ..., inputs_stubbed: _Optional[int] = ..., stubbed_node_ids: _Optional[_Iterable[str]] = ..., saved_truncation: _Optional[_Union[StepSavings, _Mapping]] = ..., saved_clearing: _Optional[_Union[StepSavings, _Mapping]] = ..., saved_stubbing: _Optional[_Union[StepSavings, _Mapping]] = ..., pinned_tokens: _Optional[int] = ..., pinned_node_ids: _Optional[_Iterable[str]] = ..., pins_exceed_budget: _Optional[bool] = ..., summary_ids: _Optional[_Iterable[str]] = ..., texts_cut: _Optional[int] = ..., text_cut_node_ids: _Optional[_Iterable[str]] = ..., saved_text_cut: _Optional[_Union[StepSavings, _Mapping]] = ..., payback_calls: _Optional[int] = ..., priced_by: _Optional[str] = ..., edit_clear: _Optional[int] = ..., edit_keep: _Optional[int] = ..., thinking_dropped: _Optional[int] = ...) -> None: ...

class StepSavings(_message.Message):
    __slots__ = ("items", "chars", "tokens")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    CHARS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    items: int
    chars: int
    tokens: int
    def __init__(self, items: _Optional[int] = ..., chars: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class RecallRequest(_message.Message):
    __slots__ = ("session_id", "reference", "max_chars")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    MAX_CHARS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    reference: str
    max_chars: int
    def __init__(self, session_id: _Optional[str] = ..., reference: _Optional[str] = ..., max_chars: _Optional[int] = ...) -> None: ...

class RecallResponse(_message.Message):
    __slots__ = ("node_id", "kind", "content", "total_chars", "truncated", "tool_call_id", "tool_name")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CHARS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    kind: str
    content: str
    total_chars: int
    truncated: bool
    tool_call_id: str
    tool_name: str
    def __init__(self, node_id: _Optional[str] = ..., kind: _Optional[str] = ..., content: _Optional[str] = ..., total_chars: _Optional[int] = ..., truncated: _Optional[bool] = ..., tool_call_id: _Optional[str] = ..., tool_name: _Optional[str] = ...) -> None: ...

class RecallToolRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RecallToolResponse(_message.Message):
    __slots__ = ("name", "anthropic_json", "openai_json", "responses_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ANTHROPIC_JSON_FIELD_NUMBER: _ClassVar[int]
    OPENAI_JSON_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    anthropic_json: str
    openai_json: str
    responses_json: str
    def __init__(self, name: _Optional[str] = ..., anthropic_json: _Optional[str] = ..., openai_json: _Optional[str] = ..., responses_json: _Optional[str] = ...) -> None: ...

class PrepareCompactionRequest(_message.Message):
    __slots__ = ("session_id", "branch", "budget", "tokenizer", "retain_turns", "instructions", "max_tool_result_chars", "format", "from_node_id", "to_node_id", "cache_sharing_request", "policy")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    RETAIN_TURNS_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_RESULT_CHARS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_SHARING_REQUEST_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    branch: str
    budget: Budget
    tokenizer: str
    retain_turns: int
    instructions: str
    max_tool_result_chars: int
    format: Format
    from_node_id: str
    to_node_id: str
    cache_sharing_request: bool
    policy: RenderPolicy
    def __init__(self, session_id: _Optional[str] = ..., branch: _Optional[str] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., tokenizer: _Optional[str] = ..., retain_turns: _Optional[int] = ..., instructions: _Optional[str] = ..., max_tool_result_chars: _Optional[int] = ..., format: _Optional[_Union[Format, str]] = ..., from_node_id: _Optional[str] = ..., to_node_id: _Optional[str] = ..., cache_sharing_request: _Optional[bool] = ..., policy: _Optional[_Union[RenderPolicy, _Mapping]] = ...) -> None: ...

class PrepareCompactionResponse(_message.Message):
    __slots__ = ("needed", "compaction_id", "base_head_id", "covers_ids", "prior_summary_id", "summary_input", "tokens_before", "input_tokens", "reason", "history_budget", "retained_turns", "summary_input_json", "ledger", "ledger_text", "rolls_over_ids", "kind", "summary_request", "summary_request_json")
    NEEDED_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_HEAD_ID_FIELD_NUMBER: _ClassVar[int]
    COVERS_IDS_FIELD_NUMBER: _ClassVar[int]
    PRIOR_SUMMARY_ID_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_INPUT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HISTORY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    RETAINED_TURNS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    LEDGER_TEXT_FIELD_NUMBER: _ClassVar[int]
    ROLLS_OVER_IDS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_REQUEST_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    needed: bool
    compaction_id: str
    base_head_id: str
    covers_ids: _containers.RepeatedScalarFieldContainer[str]
    prior_summary_id: str
    summary_input: _containers.RepeatedCompositeFieldContainer[RenderedMessage]
    tokens_before: int
    input_tokens: int
    reason: str
    history_budget: int
    retained_turns: int
    summary_input_json: str
    ledger: EvidenceLedger
    ledger_text: str
    rolls_over_ids: _containers.RepeatedScalarFieldContainer[str]
    kind: SummaryKind
    summary_request: _containers.RepeatedCompositeFieldContainer[RenderedMessage]
    summary_request_json: str
    def __init__(self, needed: _Optional[bool] = ..., compaction_id: _Optional[str] = ..., base_head_id: _Optional[str] = ..., covers_ids: _Optional[_Iterable[str]] = ..., prior_summary_id: _Optional[str] = ..., summary_input: _Optional[_Iterable[_Union[RenderedMessage, _Mapping]]] = ..., tokens_before: _Optional[int] = ..., input_tokens: _Optional[int] = ..., reason: _Optional[str] = ..., history_budget: _Optional[int] = ..., retained_turns: _Optional[int] = ..., summary_input_json: _Optional[str] = ..., ledger: _Optional[_Union[EvidenceLedger, _Mapping]] = ..., ledger_text: _Optional[str] = ..., rolls_over_ids: _Optional[_Iterable[str]] = ..., kind: _Optional[_Union[SummaryKind, str]] = ..., summary_request: _Optional[_Iterable[_Union[RenderedMessage, _Mapping]]] = ..., summary_request_json: _Optional[str] = ...) -> None: ...

class EvidenceLedger(_message.Message):
    __slots__ = ("files_read", "files_modified", "commands", "errors", "user_requests", "functions")
    FILES_READ_FIELD_NUMBER: _ClassVar[int]
    FILES_MODIFIED_FIELD_NUMBER: _ClassVar[int]
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    USER_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    files_read: _containers.RepeatedCompositeFieldContainer[FileUse]
    files_modified: _containers.RepeatedCompositeFieldContainer[FileUse]
    commands: _containers.RepeatedCompositeFieldContainer[CommandRun]
    errors: _containers.RepeatedCompositeFieldContainer[ErrorSeen]
    user_requests: _containers.RepeatedScalarFieldContainer[str]
    functions: _containers.RepeatedCompositeFieldContainer[FunctionUse]
    def __init__(self, files_read: _Optional[_Iterable[_Union[FileUse, _Mapping]]] = ..., files_modified: _Optional[_Iterable[_Union[FileUse, _Mapping]]] = ..., commands: _Optional[_Iterable[_Union[CommandRun, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[ErrorSeen, _Mapping]]] = ..., user_requests: _Optional[_Iterable[str]] = ..., functions: _Optional[_Iterable[_Union[FunctionUse, _Mapping]]] = ...) -> None: ...

class FileUse(_message.Message):
    __slots__ = ("path", "tools", "count")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    path: str
    tools: _containers.RepeatedScalarFieldContainer[str]
    count: int
    def __init__(self, path: _Optional[str] = ..., tools: _Optional[_Iterable[str]] = ..., count: _Optional[int] = ...) -> None: ...

class CommandRun(_message.Message):
    __slots__ = ("command", "exit_code", "is_error")
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    command: str
    exit_code: int
    is_error: bool
    def __init__(self, command: _Optional[str] = ..., exit_code: _Optional[int] = ..., is_error: _Optional[bool] = ...) -> None: ...

class ErrorSeen(_message.Message):
    __slots__ = ("tool", "line")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    tool: str
    line: str
    def __init__(self, tool: _Optional[str] = ..., line: _Optional[str] = ...) -> None: ...

class FunctionUse(_message.Message):
    __slots__ = ("name", "input", "output", "is_error")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    input: str
    output: str
    is_error: bool
    def __init__(self, name: _Optional[str] = ..., input: _Optional[str] = ..., output: _Optional[str] = ..., is_error: _Optional[bool] = ...) -> None: ...

class CommitSummaryRequest(_message.Message):
    __slots__ = ("compaction_id", "text", "model")
    COMPACTION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    compaction_id: str
    text: str
    model: str
    def __init__(self, compaction_id: _Optional[str] = ..., text: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class CompactionOutcome(_message.Message):
    __slots__ = ("applied", "summary_id", "tokens_before", "tokens_after", "reason", "message", "compaction_id")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_AFTER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_ID_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    summary_id: str
    tokens_before: int
    tokens_after: int
    reason: CompactionReason
    message: str
    compaction_id: str
    def __init__(self, applied: _Optional[bool] = ..., summary_id: _Optional[str] = ..., tokens_before: _Optional[int] = ..., tokens_after: _Optional[int] = ..., reason: _Optional[_Union[CompactionReason, str]] = ..., message: _Optional[str] = ..., compaction_id: _Optional[str] = ...) -> None: ...

class CancelCompactionRequest(_message.Message):
    __slots__ = ("compaction_id", "reason")
    COMPACTION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    compaction_id: str
    reason: str
    def __init__(self, compaction_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelCompactionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSummariesRequest(_message.Message):
    __slots__ = ("session_id", "branch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    branch: str
    def __init__(self, session_id: _Optional[str] = ..., branch: _Optional[str] = ...) -> None: ...

class SummaryRecord(_message.Message):
    __slots__ = ("summary_id", "compaction_id", "covers_ids", "prior_summary_id", "text", "model", "base_head_id", "tokens_before", "tokens_after", "created_at_unix_ms", "applies", "active", "kind", "from_node_id", "to_node_id", "rolls_over_ids", "ledger")
    SUMMARY_ID_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_ID_FIELD_NUMBER: _ClassVar[int]
    COVERS_IDS_FIELD_NUMBER: _ClassVar[int]
    PRIOR_SUMMARY_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BASE_HEAD_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    APPLIES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLLS_OVER_IDS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    summary_id: str
    compaction_id: str
    covers_ids: _containers.RepeatedScalarFieldContainer[str]
    prior_summary_id: str
    text: str
    model: str
    base_head_id: str
    tokens_before: int
    tokens_after: int
    created_at_unix_ms: int
    applies: bool
    active: bool
    kind: SummaryKind
    from_node_id: str
    to_node_id: str
    rolls_over_ids: _containers.RepeatedScalarFieldContainer[str]
    ledger: EvidenceLedger
    def __init__(self, summary_id: _Optional[str] = ..., compaction_id: _Optional[str] = ..., covers_ids: _Optional[_Iterable[str]] = ..., prior_summary_id: _Optional[str] = ..., text: _Optional[str] = ..., model: _Optional[str] = ..., base_head_id: _Optional[str] = ..., tokens_before: _Optional[int] = ..., tokens_after: _Optional[int] = ..., created_at_unix_ms: _Optional[int] = ..., applies: _Optional[bool] = ..., active: _Optional[bool] = ..., kind: _Optional[_Union[SummaryKind, str]] = ..., from_node_id: _Optional[str] = ..., to_node_id: _Optional[str] = ..., rolls_over_ids: _Optional[_Iterable[str]] = ..., ledger: _Optional[_Union[EvidenceLedger, _Mapping]] = ...) -> None: ...

class CompactionEvent(_message.Message):
    __slots__ = ("compaction_id", "branch", "kind", "reason", "base_head_id", "tokens_before", "tokens_after", "summary_id", "message", "created_at_unix_ms")
    COMPACTION_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BASE_HEAD_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_AFTER_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    compaction_id: str
    branch: str
    kind: str
    reason: CompactionReason
    base_head_id: str
    tokens_before: int
    tokens_after: int
    summary_id: str
    message: str
    created_at_unix_ms: int
    def __init__(self, compaction_id: _Optional[str] = ..., branch: _Optional[str] = ..., kind: _Optional[str] = ..., reason: _Optional[_Union[CompactionReason, str]] = ..., base_head_id: _Optional[str] = ..., tokens_before: _Optional[int] = ..., tokens_after: _Optional[int] = ..., summary_id: _Optional[str] = ..., message: _Optional[str] = ..., created_at_unix_ms: _Optional[int] = ...) -> None: ...

class ListSummariesResponse(_message.Message):
    __slots__ = ("summaries", "events")
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    summaries: _containers.RepeatedCompositeFieldContainer[SummaryRecord]
    events: _containers.RepeatedCompositeFieldContainer[CompactionEvent]
    def __init__(self, summaries: _Optional[_Iterable[_Union[SummaryRecord, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[CompactionEvent, _Mapping]]] = ...) -> None: ...

class CompactRequest(_message.Message):
    __slots__ = ("session_id", "branch", "budget", "tokenizer", "retain_turns", "instructions", "max_tool_result_chars", "from_node_id", "to_node_id", "request_form", "policy")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    RETAIN_TURNS_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_RESULT_CHARS_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FORM_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    branch: str
    budget: Budget
    tokenizer: str
    retain_turns: int
    instructions: str
    max_tool_result_chars: int
    from_node_id: str
    to_node_id: str
    request_form: SummaryRequestForm
    policy: RenderPolicy
    def __init__(self, session_id: _Optional[str] = ..., branch: _Optional[str] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., tokenizer: _Optional[str] = ..., retain_turns: _Optional[int] = ..., instructions: _Optional[str] = ..., max_tool_result_chars: _Optional[int] = ..., from_node_id: _Optional[str] = ..., to_node_id: _Optional[str] = ..., request_form: _Optional[_Union[SummaryRequestForm, str]] = ..., policy: _Optional[_Union[RenderPolicy, _Mapping]] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("session_id", "node_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., node_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PinResponse(_message.Message):
    __slots__ = ("pinned_ids",)
    PINNED_IDS_FIELD_NUMBER: _ClassVar[int]
    pinned_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pinned_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ImportChunk(_message.Message):
    __slots__ = ("format", "metadata", "data", "idempotency_key")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    format: ImportFormat
    metadata: _containers.ScalarMap[str, str]
    data: bytes
    idempotency_key: str
    def __init__(self, format: _Optional[_Union[ImportFormat, str]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., data: _Optional[bytes] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class ImportSessionResponse(_message.Message):
    __slots__ = ("session", "nodes", "functions", "summaries", "format", "warnings")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    session: Session
    nodes: int
    functions: int
    summaries: int
    format: ImportFormat
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., nodes: _Optional[int] = ..., functions: _Optional[int] = ..., summaries: _Optional[int] = ..., format: _Optional[_Union[ImportFormat, str]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DeleteSessionResponse(_message.Message):
    __slots__ = ("tombstone", "already_deleted")
    TOMBSTONE_FIELD_NUMBER: _ClassVar[int]
    ALREADY_DELETED_FIELD_NUMBER: _ClassVar[int]
    tombstone: Tombstone
    already_deleted: bool
    def __init__(self, tombstone: _Optional[_Union[Tombstone, _Mapping]] = ..., already_deleted: _Optional[bool] = ...) -> None: ...

class Tombstone(_message.Message):
    __slots__ = ("session_id", "deleted_by", "deleted_at_unix_ms", "nodes", "branches", "summaries")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DELETED_BY_FIELD_NUMBER: _ClassVar[int]
    DELETED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    deleted_by: str
    deleted_at_unix_ms: int
    nodes: int
    branches: int
    summaries: int
    def __init__(self, session_id: _Optional[str] = ..., deleted_by: _Optional[str] = ..., deleted_at_unix_ms: _Optional[int] = ..., nodes: _Optional[int] = ..., branches: _Optional[int] = ..., summaries: _Optional[int] = ...) -> None: ...

class ExportSessionRequest(_message.Message):
    __slots__ = ("session_id", "format", "branch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    format: ExportFormat
    branch: str
    def __init__(self, session_id: _Optional[str] = ..., format: _Optional[_Union[ExportFormat, str]] = ..., branch: _Optional[str] = ...) -> None: ...

class ExportChunk(_message.Message):
    __slots__ = ("data", "branches", "warnings")
    DATA_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    branches: _containers.RepeatedCompositeFieldContainer[Branch]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, data: _Optional[bytes] = ..., branches: _Optional[_Iterable[_Union[Branch, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("session_id", "branch", "after_cursor", "after_node_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    AFTER_CURSOR_FIELD_NUMBER: _ClassVar[int]
    AFTER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    branch: str
    after_cursor: str
    after_node_id: str
    def __init__(self, session_id: _Optional[str] = ..., branch: _Optional[str] = ..., after_cursor: _Optional[str] = ..., after_node_id: _Optional[str] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("cursor", "branch", "started", "node", "head_moved", "branch_created", "branch_deleted", "compaction", "deleted")
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    HEAD_MOVED_FIELD_NUMBER: _ClassVar[int]
    BRANCH_CREATED_FIELD_NUMBER: _ClassVar[int]
    BRANCH_DELETED_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    cursor: str
    branch: str
    started: WatchStarted
    node: Node
    head_moved: Branch
    branch_created: Branch
    branch_deleted: Branch
    compaction: CompactionEvent
    deleted: Tombstone
    def __init__(self, cursor: _Optional[str] = ..., branch: _Optional[str] = ..., started: _Optional[_Union[WatchStarted, _Mapping]] = ..., node: _Optional[_Union[Node, _Mapping]] = ..., head_moved: _Optional[_Union[Branch, _Mapping]] = ..., branch_created: _Optional[_Union[Branch, _Mapping]] = ..., branch_deleted: _Optional[_Union[Branch, _Mapping]] = ..., compaction: _Optional[_Union[CompactionEvent, _Mapping]] = ..., deleted: _Optional[_Union[Tombstone, _Mapping]] = ...) -> None: ...

class WatchStarted(_message.Message):
    __slots__ = ("branches",)
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    branches: _containers.RepeatedCompositeFieldContainer[Branch]
    def __init__(self, branches: _Optional[_Iterable[_Union[Branch, _Mapping]]] = ...) -> None: ...

class BackupDatabaseRequest(_message.Message):
    __slots__ = ("to",)
    TO_FIELD_NUMBER: _ClassVar[int]
    to: str
    def __init__(self, to: _Optional[str] = ...) -> None: ...

class BackupDatabaseResponse(_message.Message):
    __slots__ = ("path", "bytes", "took_ms")
    PATH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TOOK_MS_FIELD_NUMBER: _ClassVar[int]
    path: str
    bytes: int
    took_ms: int
    def __init__(self, path: _Optional[str] = ..., bytes: _Optional[int] = ..., took_ms: _Optional[int] = ...) -> None: ...

class CollectGarbageRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CollectGarbageResponse(_message.Message):
    __slots__ = ("sessions", "tombstones", "database_bytes", "free_bytes", "released_bytes")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONES_FIELD_NUMBER: _ClassVar[int]
    DATABASE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RELEASED_BYTES_FIELD_NUMBER: _ClassVar[int]
    sessions: int
    tombstones: int
    database_bytes: int
    free_bytes: int
    released_bytes: int
    def __init__(self, sessions: _Optional[int] = ..., tombstones: _Optional[int] = ..., database_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., released_bytes: _Optional[int] = ...) -> None: ...
