"""Python client for ctxd, the persistent session store for LLM agents.

    from ctxd_client import Client

    with Client("127.0.0.1:50051") as ctxd:
        session = ctxd.create_session()
        ctxd.append_user(session, "What is in README.md?")
        context = ctxd.render(session, budget=128_000)   # OpenAI chat `messages`
        context.messages, context.report.fits

`AsyncClient` has the same methods for asyncio (`async with AsyncClient(...) as ctxd`, `await
ctxd.render(...)`, `async for event in ctxd.watch(session)`).

Give the model the recall tool (`recall_tool_definition`, answered by `handle_recall`) and it can
ask for anything a render cleared or shortened (see `ctxd_client.recall`).

The generated protobuf modules are `ctxd_client.pb` and `ctxd_client.pb_grpc`.
"""

from ._proto import ctxd_pb2 as pb
from ._proto import ctxd_pb2_grpc as pb_grpc
from .aio import AsyncClient, AsyncFunctionCall
from .client import (
    Client,
    FunctionCall,
    assistant_message,
    system_message,
    tool_call,
    tool_result,
    user_message,
)
from .errors import (
    AlreadyExists,
    Conflict,
    CtxdError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unauthenticated,
    Unavailable,
)
from .recall import (
    RECALL_REFERENCE,
    RECALL_TOOL_DESCRIPTION,
    RECALL_TOOL_NAME,
    RECALL_TOOL_PARAMETERS,
    RecallToolResult,
    handle_recall,
    recall_references,
    recall_text,
    recall_tool_definition,
)
from .types import (
    AppendBatch,
    Appended,
    Backup,
    Branch,
    Budget,
    CommandRun,
    Compaction,
    CompactionEvent,
    ContextReport,
    DeletedSession,
    ErrorSeen,
    EvidenceLedger,
    ExportChunk,
    Exported,
    FileUse,
    FunctionUse,
    GarbageCollection,
    GatewayCall,
    GatewayCallPage,
    Imported,
    Node,
    Outcome,
    Recalled,
    RecallToolDefinitions,
    RenderResult,
    Session,
    SessionPage,
    Summaries,
    SummaryRecord,
    TokenBreakdown,
    Tombstone,
    UncarriedPart,
    WatchEvent,
)

__all__ = [
    "RECALL_REFERENCE",
    "RECALL_TOOL_DESCRIPTION",
    "RECALL_TOOL_NAME",
    "RECALL_TOOL_PARAMETERS",
    "AlreadyExists",
    "AppendBatch",
    "Appended",
    "AsyncClient",
    "AsyncFunctionCall",
    "Backup",
    "Branch",
    "Budget",
    "Client",
    "CommandRun",
    "Compaction",
    "CompactionEvent",
    "Conflict",
    "ContextReport",
    "CtxdError",
    "DeletedSession",
    "ErrorSeen",
    "EvidenceLedger",
    "ExportChunk",
    "Exported",
    "FailedPrecondition",
    "FileUse",
    "FunctionCall",
    "FunctionUse",
    "GarbageCollection",
    "GatewayCall",
    "GatewayCallPage",
    "Imported",
    "InvalidArgument",
    "Node",
    "NotFound",
    "Outcome",
    "RecallToolDefinitions",
    "RecallToolResult",
    "Recalled",
    "RenderResult",
    "Session",
    "SessionPage",
    "Summaries",
    "SummaryRecord",
    "TokenBreakdown",
    "Tombstone",
    "Unauthenticated",
    "Unavailable",
    "UncarriedPart",
    "WatchEvent",
    "assistant_message",
    "handle_recall",
    "pb",
    "pb_grpc",
    "recall_references",
    "recall_text",
    "recall_tool_definition",
    "system_message",
    "tool_call",
    "tool_result",
    "user_message",
]
