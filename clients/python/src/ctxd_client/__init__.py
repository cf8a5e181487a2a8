"""Python client for ctxd, the persistent session store for LLM agents.

    from ctxd_client import Client

    with Client("127.0.0.1:50051") as ctxd:
        session = ctxd.create_session()
        ctxd.append_user(session, "What is in README.md?")
        context = ctxd.render(session, budget=128_000)   # OpenAI chat `messages`
        context.messages, context.report.fits

The generated protobuf modules are `ctxd_client.pb` and `ctxd_client.pb_grpc`.
"""

from ._proto import ctxd_pb2 as pb
from ._proto import ctxd_pb2_grpc as pb_grpc
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
from .types import (
    Appended,
    Branch,
    Budget,
    CommandRun,
    Compaction,
    CompactionEvent,
    ContextReport,
    ErrorSeen,
    EvidenceLedger,
    FileUse,
    FunctionUse,
    Node,
    Outcome,
    RenderResult,
    UncarriedPart,
    Session,
    Summaries,
    SummaryRecord,
    TokenBreakdown,
)

__all__ = [
    "AlreadyExists",
    "Appended",
    "Branch",
    "Budget",
    "Client",
    "CommandRun",
    "Compaction",
    "CompactionEvent",
    "Conflict",
    "ContextReport",
    "CtxdError",
    "ErrorSeen",
    "EvidenceLedger",
    "FailedPrecondition",
    "FileUse",
    "FunctionCall",
    "FunctionUse",
    "InvalidArgument",
    "Node",
    "NotFound",
    "Outcome",
    "RenderResult",
    "UncarriedPart",
    "Session",
    "Summaries",
    "SummaryRecord",
    "TokenBreakdown",
    "Unauthenticated",
    "Unavailable",
    "assistant_message",
    "pb",
    "pb_grpc",
    "system_message",
    "tool_call",
    "tool_result",
    "user_message",
]
