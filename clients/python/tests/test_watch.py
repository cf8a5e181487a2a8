"""`Client.watch`: typed events with cursors, a resume after the connection drops mid-stream
(through a proxy whose sockets the test cuts) with no event lost or repeated, a clean stop when
the caller leaves the loop, and errors that are not resumed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from tcp_proxy import TcpProxy

from ctxd_client import Client, InvalidArgument, NotFound, Session, Unavailable, WatchEvent

# Only a hang fails at this: a healthy watch answers in milliseconds.
WATCHDOG_SECONDS = 30


def take(events: Iterator[WatchEvent], n: int) -> list[WatchEvent]:
    return [next(events) for _ in range(n)]


def node_ids(events: list[WatchEvent]) -> list[str]:
    assert [e.kind for e in events] == ["node"] * len(events), [e.kind for e in events]
    return [e.node.id for e in events if e.node is not None]


@pytest.fixture
def proxy(server: str) -> Iterator[TcpProxy]:
    p = TcpProxy(server)
    yield p
    p.close()


@pytest.fixture
def watcher(proxy: TcpProxy) -> Iterator[Client]:
    """A client whose calls go through the proxy, closed by a watchdog if a test hangs."""
    with Client(proxy.address, timeout=30) as c:
        watchdog = threading.Timer(WATCHDOG_SECONDS, c.close)
        watchdog.start()
        yield c
        watchdog.cancel()


def test_events_are_typed_and_carry_cursors(client: Client, session: Session) -> None:
    events = client.watch(session)
    started = next(events)
    assert started.kind == "started" and started.cursor
    assert [b.name for b in started.branches] == ["main"]

    user = client.append_user(session, "hello")
    node = next(events)
    assert (node.kind, node.branch) == ("node", "main")
    assert node.node is not None and node.node.id == user.node_id
    assert node.node.content["content"] == "hello"

    client.create_branch(session, "alt", user.node_id)
    created = next(events)
    assert created.kind == "branch_created" and created.ref is not None
    assert (created.ref.name, created.ref.head_id) == ("alt", user.node_id)
    client.reset_branch(session, "main", None)
    moved = next(events)
    assert moved.kind == "head_moved" and moved.ref is not None
    assert (moved.ref.name, moved.ref.head_id) == ("main", "")
    client.delete_branch(session, "alt")
    deleted_branch = next(events)
    assert deleted_branch.kind == "branch_deleted" and deleted_branch.branch == "alt"

    # Deleting the session is the last event: its tombstone, then the iterator ends.
    client.delete_session(session)
    last = next(events)
    assert last.kind == "deleted" and last.tombstone is not None
    assert (last.tombstone.session_id, last.tombstone.nodes) == (session.id, 1)
    assert list(events) == []

    cursors = [started.cursor, node.cursor, created.cursor, moved.cursor]
    assert len(set(cursors)) == len(cursors)


def test_a_watch_resumes_after_the_connection_drops(
    client: Client, session: Session, proxy: TcpProxy, watcher: Client
) -> None:
    events = watcher.watch(session, "main")
    assert next(events).kind == "started"
    before = [client.append_user(session, f"before {i}").node_id for i in range(3)]
    assert node_ids(take(events, 3)) == before

    # Cut the stream, then append while the watcher is cut off: these events cannot reach it on
    # the old connection and must come on the resumed one, once each and in order.
    proxy.drop()
    during = [client.append_user(session, f"during {i}").node_id for i in range(3)]
    assert node_ids(take(events, 3)) == during
    assert proxy.accepted == 2, "the watch did not reconnect"
    # Nothing repeated: the next event is the next append (not the resumed stream's `started`
    # nor an event delivered before the drop).
    after = client.append_user(session, "after").node_id
    assert node_ids(take(events, 1)) == [after]
    events.close()


def test_a_watch_resumes_from_a_cursor_the_caller_kept(client: Client, session: Session) -> None:
    events = client.watch(session)
    next(events)
    first = client.append_user(session, "one").node_id
    seen = next(events)
    assert seen.node is not None and seen.node.id == first
    events.close()

    missed = [client.append_user(session, f"missed {i}").node_id for i in range(2)]
    resumed = client.watch(session, after_cursor=seen.cursor)
    assert next(resumed).kind == "started"  # a new watch starts with one, resumed or not
    assert node_ids(take(resumed, 2)) == missed
    resumed.close()


class _KeepCalls(grpc.UnaryStreamClientInterceptor):
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        call = continuation(details, request)
        self.calls.append(call)
        return call


def test_leaving_the_loop_cancels_the_call(server: str, session: Session) -> None:
    kept = _KeepCalls()
    channel = grpc.intercept_channel(grpc.insecure_channel(server), kept)
    with Client(channel=channel) as c:
        for event in c.watch(session):
            assert event.kind == "started"
            break
        # The server's stream never ends by itself: only the client's cancel ends the call.
        (call,) = kept.calls
        assert not call.is_active()
        assert call.code() == grpc.StatusCode.CANCELLED
    channel.close()


def test_errors_other_than_a_drop_are_raised_not_resumed(client: Client, session: Session) -> None:
    with pytest.raises(NotFound):
        next(client.watch("01a23d04-c2d9-77cd-8daf-b569585f95f7"))
    with pytest.raises(InvalidArgument, match="after_cursor"):
        next(client.watch(session, after_cursor="not-a-cursor"))


def test_a_server_that_stays_away_is_unavailable_after_the_attempts() -> None:
    with Client("127.0.0.1:1") as c, pytest.raises(Unavailable, match="127.0.0.1:1"):
        next(c.watch("01a23d04-c2d9-77cd-8daf-b569585f95f7", reconnect_attempts=2))
