"""`AsyncClient`: the client for asyncio, on `grpc.aio`, with the same methods as `Client`.

Each method is the `Client` method of the same name, awaited: the requests and answers are built
by the same code (`_ops`), and failures raise the same `CtxdError` subclasses. Streaming methods
are async iterators (`export_session`, `watch`) or take async-friendly sources (`append_many`
takes an iterable or an async iterable of batches).

    async with AsyncClient("127.0.0.1:50051") as ctxd:
        session = await ctxd.create_session()
        await ctxd.append_user(session, "hello")
        context = await ctxd.render(session, budget=128_000)
        async for event in ctxd.watch(session):
            ...
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from types import TracebackType
from typing import IO, Any, Concatenate, Literal, ParamSpec, TypeVar

import grpc
import grpc.aio

from . import _ops as ops
from ._ops import (
    ExportFormat,
    Expose,
    FunctionScope,
    ImportFormat,
    ImportSource,
    SessionRef,
)
from ._proto import ctxd_pb2 as pb
from ._proto import ctxd_pb2_grpc as pb_grpc
from .errors import CtxdError, from_rpc_error
from .types import AppendBatch, Appended, ExportChunk, Exported, Imported, WatchEvent

P = ParamSpec("P")
R = TypeVar("R")

Batch = Sequence[pb.NodeInput] | AppendBatch


def _awaiting(
    exchange: Callable[P, ops.Exchange[R]],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, R]]:
    """An `AsyncClient` method running `exchange`, awaiting each call it asks for."""

    async def method(self: AsyncClient, *args: P.args, **kwargs: P.kwargs) -> R:
        return await self._run(exchange(*args, **kwargs))

    return ops.bind(exchange, method, "AsyncClient")  # type: ignore[no-any-return]


def _awaiting_in(
    exchange: Callable[Concatenate[FunctionScope, P], ops.Exchange[R]],
) -> Callable[Concatenate[AsyncFunctionCall, P], Coroutine[Any, Any, R]]:
    """An `AsyncFunctionCall` method running `exchange` on the handle, through its client."""

    async def method(self: AsyncFunctionCall, *args: P.args, **kwargs: P.kwargs) -> R:
        return await self.client._run(exchange(self, *args, **kwargs))

    return ops.bind(exchange, method, "AsyncFunctionCall")  # type: ignore[no-any-return]


class _BearerKey(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor,
    grpc.aio.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <key>` to every call of the channel, whatever its kind."""

    def __init__(self, header: tuple[str, str]) -> None:
        self._header = header

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        return grpc.aio.ClientCallDetails(
            details.method,
            details.timeout,
            grpc.aio.Metadata(*(details.metadata or ()), self._header),
            details.credentials,
            details.wait_for_ready,
        )

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


class AsyncClient:
    """A connection to a ctxd server for asyncio; `async with` it so the channel gets closed.
    Create it inside the event loop that uses it (a `grpc.aio` channel belongs to one loop).

    The options are `Client`'s. With a `channel` of your own and `api_key`, the key goes with
    every call of this client's methods but not with calls on `stub` (an aio channel's
    interceptors are fixed when it is made: give it yours).
    """

    def __init__(
        self,
        address: str = "127.0.0.1:50051",
        *,
        timeout: float | None = None,
        channel: grpc.aio.Channel | None = None,
        api_key: str | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        credentials = ops.channel_credentials(
            channel is not None, tls, root_certificates, private_key, certificate_chain
        )
        header = ops.bearer_header(api_key) if api_key is not None else None
        self._owns_channel = channel is None
        self._metadata: tuple[tuple[str, str], ...] = ()
        if channel is None:
            interceptors = [_BearerKey(header)] if header else None
            if credentials is not None:
                channel = grpc.aio.secure_channel(address, credentials, interceptors=interceptors)
            else:
                channel = grpc.aio.insecure_channel(address, interceptors=interceptors)
        elif header:
            self._metadata = (header,)
        self._channel = channel
        self.stub = pb_grpc.ContextStoreStub(channel)
        """The generated stub (its calls are awaitable), for what the methods do not cover."""

    async def close(self) -> None:
        """Closes the channel if this client opened it."""
        if self._owns_channel:
            await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _options(self) -> dict[str, Any]:
        return {"timeout": self.timeout, "metadata": self._metadata or None}

    async def _call(self, rpc: str, request: Any) -> Any:
        try:
            return await getattr(self.stub, rpc)(request, **self._options())
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e

    async def _run(self, exchange: ops.Exchange[R]) -> R:
        """Makes each call `exchange` asks for and returns its answer."""
        try:
            rpc, request = next(exchange)
            while True:
                rpc, request = exchange.send(await self._call(rpc, request))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    # ------------------------------------------------------------ sessions

    create_session = _awaiting(ops.create_session)
    get_session = _awaiting(ops.get_session)
    list_sessions = _awaiting(ops.list_sessions)
    list_gateway_calls = _awaiting(ops.list_gateway_calls)
    delete_session = _awaiting(ops.delete_session)

    # ------------------------------------------------------------ appends

    append = _awaiting(ops.append)
    append_user = _awaiting(ops.append_user)
    append_assistant = _awaiting(ops.append_assistant)
    append_tool_result = _awaiting(ops.append_tool_result)

    async def append_many(
        self,
        session: SessionRef,
        batches: Iterable[Batch] | AsyncIterable[Batch],
        branch: str = "main",
        *,
        function_id: str | None = None,
    ) -> list[Appended]:
        """`Client.append_many`, awaited: many appends over one AppendStream, each batch
        checked as one `append`; `batches` may be an iterable or an async iterable (read as the
        stream sends). Refusals and failures raise the same way, with `acknowledged`; an
        exception raised by `batches` ends the stream after the batches it yielded and
        propagates."""
        session_id = ops.session_id(session)
        failure: list[Exception] = []

        async def requests() -> AsyncIterator[pb.AppendRequest]:
            # As in Client.append_many: the caller's exception ends the stream after what it
            # yielded (all written), and is raised from here.
            try:
                if isinstance(batches, AsyncIterable):
                    async for batch in batches:
                        yield ops.batch_request(session_id, batch, branch, function_id)
                else:
                    for batch in batches:
                        yield ops.batch_request(session_id, batch, branch, function_id)
            except Exception as e:
                failure.append(e)

        answers = ops.AppendStreamAnswers()
        call = self.stub.AppendStream(requests(), **self._options())
        try:
            async for response in call:
                answers.add(response)
        except grpc.RpcError as e:
            raise from_rpc_error(e, answers.acknowledged) from e
        finally:
            call.cancel()
        if failure:
            ops.note_stored(failure[0], len(answers.acknowledged))
            raise failure[0]
        return answers.acknowledged

    def function(
        self,
        session: SessionRef,
        call_id: str,
        input: str,
        expose: Expose = "io",
        branch: str = "main",
    ) -> AsyncFunctionCall:
        """`Client.function` as an async context manager:

        async with ctxd.function(session, "call_1", "find the bug") as fn:
            await fn.append_user("find the bug")
            fn.output = "it is in parse()"
        """
        return AsyncFunctionCall(
            self, ops.session_id(session), call_id, input, expose, branch=branch
        )

    # ------------------------------------------------------------ reading and branches

    get_nodes = _awaiting(ops.get_nodes)
    log = _awaiting(ops.log)
    create_branch = _awaiting(ops.create_branch)
    list_branches = _awaiting(ops.list_branches)
    delete_branch = _awaiting(ops.delete_branch)
    reset_branch = _awaiting(ops.reset_branch)
    pin = _awaiting(ops.pin)
    unpin = _awaiting(ops.unpin)

    # ------------------------------------------------------------ rendering and recall

    render = _awaiting(ops.render)
    context_stats = _awaiting(ops.context_stats)
    recall = _awaiting(ops.recall)
    recall_tool = _awaiting(ops.recall_tool)

    # ------------------------------------------------------------ summaries

    prepare_compaction = _awaiting(ops.prepare_compaction)
    commit_summary = _awaiting(ops.commit_summary)
    cancel_compaction = _awaiting(ops.cancel_compaction)
    compact = _awaiting(ops.compact)
    list_summaries = _awaiting(ops.list_summaries)

    # ------------------------------------------------------------ import and export

    async def import_session(
        self,
        source: ImportSource,
        format: ImportFormat = "auto",
        *,
        metadata: Mapping[str, str] | None = None,
        idempotency_key: str = "",
    ) -> Imported:
        """`Client.import_session`, awaited (a file is read in chunks as the stream sends)."""
        with ops.import_data(source) as data:
            feed = ops.ImportFeed(data, format, metadata, idempotency_key)
            try:
                response = await self.stub.ImportSession(iter(feed), **self._options())
            except grpc.RpcError as e:
                feed.raise_failure()
                raise from_rpc_error(e) from e
        return Imported.from_pb(response)

    def export_session(
        self, session: SessionRef, format: ExportFormat = "ctxd_jsonl", branch: str = "main"
    ) -> AsyncIterator[ExportChunk]:
        """`Client.export_session` as an async iterator of chunks."""
        # Built before the first chunk is asked for, so that a bad format fails here.
        return self._export(ops.export_request(session, format, branch))

    async def _export(self, request: pb.ExportSessionRequest) -> AsyncIterator[ExportChunk]:
        call = self.stub.ExportSession(request, **self._options())
        try:
            async for chunk in call:
                yield ExportChunk.from_pb(chunk)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e
        finally:
            call.cancel()

    async def export_session_to(
        self,
        session: SessionRef,
        to: str | os.PathLike[str] | IO[bytes],
        format: ExportFormat = "ctxd_jsonl",
        branch: str = "main",
    ) -> Exported:
        """`Client.export_session_to`, awaited. The chunks are written as they come (local
        writes of one chunk each, done on the event loop)."""
        with ops.ExportWriter(to, format) as writer:
            async for chunk in self.export_session(session, format, branch):
                writer.write(chunk)
        return writer.exported()

    # ------------------------------------------------------------ watch

    async def watch(
        self,
        session: SessionRef,
        branch: str = "",
        *,
        after_cursor: str = "",
        after_node_id: str = "",
        reconnect_attempts: int = 8,
    ) -> AsyncIterator[WatchEvent]:
        """`Client.watch` as an async iterator, resuming the same way after a dropped
        connection. Leaving the loop cancels the call when the iterator is closed: wrap it in
        `contextlib.aclosing` to close it at once."""
        state = ops.WatchState(session, branch, after_cursor, after_node_id, reconnect_attempts)
        while True:
            call = self.stub.Watch(state.request(), metadata=self._metadata or None)
            try:
                async for response in call:
                    event = state.accept(response)
                    if event is not None:
                        yield event
                return
            except grpc.RpcError as e:
                error = from_rpc_error(e)
                delay = state.retry_after(error)
                if delay is None:
                    raise error from e
            finally:
                call.cancel()
            await asyncio.sleep(delay)

    # ------------------------------------------------------------ admin

    backup_database = _awaiting(ops.backup_database)
    collect_garbage = _awaiting(ops.collect_garbage)


class AsyncFunctionCall(FunctionScope):
    """A running sub-agent (function) call of an `AsyncClient`; see `AsyncClient.function`.

    Set `output` before the block ends; after it, `result` is the append of the
    function_result.
    """

    client: AsyncClient

    async def __aenter__(self) -> AsyncFunctionCall:
        await self.client._run(ops.fn_open(self))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        if exc is None:
            await self.client._run(ops.fn_close(self, None))
            return False
        try:
            await self.client._run(ops.fn_close(self, f"{type(exc).__name__}: {exc}"))
        except CtxdError as err:
            # As in FunctionCall: the sub-agent's own exception is the one that matters.
            if hasattr(exc, "add_note"):
                exc.add_note(f"ctxd: the function call could not be closed: {err}")
        return False

    append = _awaiting_in(ops.fn_append)
    append_user = _awaiting_in(ops.fn_append_user)
    append_assistant = _awaiting_in(ops.fn_append_assistant)
    append_tool_result = _awaiting_in(ops.fn_append_tool_result)

    def function(self, call_id: str, input: str, expose: Expose = "io") -> AsyncFunctionCall:
        """A nested sub-agent call answering a pending tool call of this function's chain."""
        return AsyncFunctionCall(
            self.client,
            self.session_id,
            call_id,
            input,
            expose,
            parent_function_id=self.function_id,
        )
