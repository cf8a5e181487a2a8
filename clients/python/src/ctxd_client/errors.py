"""Exceptions: every failed RPC becomes a `CtxdError` carrying the server's status and message.

The server's codes say what a caller can do (docs/api.md, "Errors"), so the classes follow them:
`Conflict` (ABORTED) means re-read the head and retry, `FailedPrecondition` means the session is
not in a state that allows the request (calls still pending, a closed function), and so on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from .types import Appended


class CtxdError(Exception):
    """A ctxd request failed. `code` is the gRPC status, `message` the server's own words.

    `acknowledged` matters for `Client.append_many` only (empty for every other call): the
    requests of the stream the server acknowledged before it ended, in order. They are stored
    whatever the error; for a refusal, the refused request is number `len(acknowledged)` (the
    `requests[N]` the message starts with) and nothing after it was written.
    """

    def __init__(
        self, code: grpc.StatusCode, message: str, acknowledged: Sequence[Appended] = ()
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.acknowledged: list[Appended] = list(acknowledged)


class InvalidArgument(CtxdError):
    """Malformed input; the message names the field."""


class NotFound(CtxdError):
    """An unknown session, branch, node, function or compaction."""


class AlreadyExists(CtxdError):
    """A branch with that name exists already."""


class FailedPrecondition(CtxdError):
    """The request is well-formed but not allowed now (pending calls, a closed function, ...)."""


class Conflict(CtxdError):
    """A compare-and-swap lost (ABORTED): re-read the head and retry."""


class Unauthenticated(CtxdError):
    """The server wants an API key (`Client(api_key=...)`), or did not accept the one given."""


class Unavailable(CtxdError):
    """The server cannot be reached, or its database is busy: retrying may help."""


_BY_CODE: dict[grpc.StatusCode, type[CtxdError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Conflict,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}


def from_rpc_error(error: grpc.RpcError, acknowledged: Sequence[Appended] = ()) -> CtxdError:
    """The `CtxdError` subclass for a failed call, keeping the server's message verbatim (and,
    for a stream of appends, what it acknowledged before failing)."""
    # A sync call's error is a `grpc.Call`; an asyncio one (`grpc.aio.AioRpcError`) is not, but
    # has the same `code()` and `details()`: both map the same way.
    call = callable(getattr(error, "code", None)) and callable(getattr(error, "details", None))
    code = error.code() if call else grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
    message = (error.details() if call else None) or str(error)  # type: ignore[attr-defined]
    return _BY_CODE.get(code, CtxdError)(code, message, acknowledged)
