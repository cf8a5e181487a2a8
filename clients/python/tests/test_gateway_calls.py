"""`list_gateway_calls`: the model gateway's ledger of a session, read from a live server whose
gateway forwards to a fake Anthropic endpoint, by `Client` and `AsyncClient` alike: the calls in
the order made with the provider's own usage, paged; bad input raised as the right error."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import STARTUP_SECONDS, Server

from ctxd_client import AsyncClient, Client, GatewayCall, InvalidArgument, NotFound

# What the fake provider reports for every call: distinct numbers, so each is seen to arrive
# in its own field.
USAGE = {
    "input_tokens": 12,
    "cache_creation_input_tokens": 50,
    "cache_read_input_tokens": 3400,
    "output_tokens": 7,
}
# Only a hang fails at this: the gateway records a call a moment after its answer.
SECONDS = 30
# A model of the gateway's table that binds its thinking: for it the fake also reports edits
# of its own (what the provider cleared, a thinking block it dropped), as Anthropic does.
BINDING_MODEL = "claude-opus-5-5"
APPLIED_EDIT = {
    "type": "clear_tool_uses_20250919",
    "cleared_tool_uses": 8,
    "cleared_input_tokens": 4000,
}


class FakeAnthropic:
    """A Messages API endpoint answering every request with one short text and `USAGE`."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                message = {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": [{"type": "text", "text": "three"}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": USAGE,
                }
                if body["model"] == BINDING_MODEL:
                    message["context_management"] = {"applied_edits": [APPLIED_EDIT]}
                    message["input_transformations"] = [
                        {"type": "thinking_block_dropped", "message_index": 1, "content_index": 0}
                    ]
                answer = json.dumps(message).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def gateway(ctxd_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A server with its gateway in front of the fake: (gRPC address, gateway URL)."""
    fake = FakeAnthropic()
    s = Server(
        ctxd_bin,
        tmp_path_factory.mktemp("ctxd-gateway"),
        "--gateway",
        "127.0.0.1:0",
        "--anthropic-upstream",
        fake.url,
    )
    # The gateway's address is the line after the gRPC one. It may sit in the pipe's read buffer
    # already, where select() does not see it: read it on a thread, with a deadline.
    stdout = s.process.stdout
    assert stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(STARTUP_SECONDS)
    line = lines[0] if lines else ""
    match = re.fullmatch(r"ctxd gateway on (\S+)\n", line)
    assert match, f"no gateway address line: {line!r}"
    yield s.address, f"http://{match.group(1)}"
    s.stop()
    fake.close()


def forward(
    gateway_url: str, messages: list[dict], session: str = "", model: str = "claude-test-1"
) -> str:
    """One Messages call through the gateway; returns the session it was recorded in."""
    headers = {
        "content-type": "application/json",
        "anthropic-version": "2023-06-01",
        "x-api-key": "sk-ant-fake",
    }
    if session:
        headers["x-ctxd-session"] = session
    body = {"model": model, "max_tokens": 64, "messages": messages}
    request = urllib.request.Request(
        f"{gateway_url}/v1/messages", data=json.dumps(body).encode(), headers=headers
    )
    with urllib.request.urlopen(request, timeout=SECONDS) as answer:
        assert answer.status == 200
        json.load(answer)
        return answer.headers["x-ctxd-session-id"]


def calls_of(client: Client, session: str, n: int) -> list[GatewayCall]:
    """The session's ledger once it holds `n` calls."""
    deadline = time.monotonic() + SECONDS
    while True:
        calls = client.list_gateway_calls(session).calls
        if len(calls) >= n:
            return calls
        assert time.monotonic() < deadline, f"{n} call(s) recorded; have {len(calls)}"
        time.sleep(0.02)


def test_the_ledger_lists_each_forwarded_call_in_order(gateway: tuple[str, str]) -> None:
    address, url = gateway
    first = [{"role": "user", "content": "Count to three."}]
    session = forward(url, first)
    with Client(address, timeout=30) as client:
        calls_of(client, session, 1)
        second = [
            *first,
            {"role": "assistant", "content": "three"},
            {"role": "user", "content": "Now to four."},
        ]
        assert forward(url, second, session) == session
        calls = calls_of(client, session, 2)
        assert len(calls) == 2
        for call in calls:
            assert (call.api, call.model) == ("anthropic", "claude-test-1")
            assert call.input_tokens == USAGE["input_tokens"]
            assert call.cache_read_tokens == USAGE["cache_read_input_tokens"]
            assert call.cache_write_tokens == USAGE["cache_creation_input_tokens"]
            assert call.output_tokens == USAGE["output_tokens"]
            assert call.client_tokens > 0 and call.forwarded_tokens > 0
            assert isinstance(call.kept_tokens, int) and isinstance(call.change, str)
            assert isinstance(call.unexplained_miss, bool)
            # Priced by the table's catch-all Claude entry (reads 0.1x, writes 1.25x); no edit
            # asked or reported, no thinking dropped.
            assert call.priced_by == "claude"
            assert call.cost == pytest.approx(
                USAGE["input_tokens"]
                + 0.1 * USAGE["cache_read_input_tokens"]
                + 1.25 * USAGE["cache_creation_input_tokens"]
            )
            assert (call.edit_clear, call.edit_keep) == (None, None)
            assert (call.provider_cleared, call.provider_cleared_tokens) == (None, None)
            assert (call.provider_thinking_dropped, call.thinking_dropped) == (0, 0)
        assert calls[0].at_unix_ms <= calls[1].at_unix_ms
        assert calls[1].client_tokens > calls[0].client_tokens, "the second resent the first"

        # One call a page: the pages together are the ledger.
        page = client.list_gateway_calls(session, page_size=1)
        assert page.calls == calls[:1] and page.next_page_token
        rest = client.list_gateway_calls(session, page_size=1, page_token=page.next_page_token)
        assert rest.calls == calls[1:] and rest.next_page_token == ""

        # The same through the async client.
        async def read() -> list[GatewayCall]:
            async with AsyncClient(address, timeout=30) as ctxd:
                return (await ctxd.list_gateway_calls(session)).calls

        assert asyncio.run(asyncio.wait_for(read(), SECONDS)) == calls


def test_a_call_is_priced_by_its_model_with_what_the_provider_did(
    gateway: tuple[str, str],
) -> None:
    address, url = gateway
    session = forward(url, [{"role": "user", "content": "Name a prime."}], model=BINDING_MODEL)
    with Client(address, timeout=30) as client:
        [call] = calls_of(client, session, 1)
    assert call.model == call.priced_by == BINDING_MODEL
    # Its reads cost 0.05x a plain input token, its writes 1.25x.
    assert call.cost == pytest.approx(
        USAGE["input_tokens"]
        + 0.05 * USAGE["cache_read_input_tokens"]
        + 1.25 * USAGE["cache_creation_input_tokens"]
    )
    assert call.provider_cleared == APPLIED_EDIT["cleared_tool_uses"]
    assert call.provider_cleared_tokens == APPLIED_EDIT["cleared_input_tokens"]
    assert call.provider_thinking_dropped == 1
    # One call takes no step: ctxd asked for no edit and left no thinking out.
    assert (call.edit_clear, call.edit_keep, call.thinking_dropped) == (None, None, 0)


def test_a_session_the_gateway_never_served_has_no_calls(client: Client) -> None:
    session = client.create_session({"test": "python-client"})
    page = client.list_gateway_calls(session)
    assert page.calls == [] and page.next_page_token == ""


def test_bad_ledger_requests_raise(client: Client) -> None:
    session = client.create_session({"test": "python-client"})
    with pytest.raises(InvalidArgument, match="page_token"):
        client.list_gateway_calls(session, page_token="yesterday")
    with pytest.raises(InvalidArgument, match="session_id"):
        client.list_gateway_calls("not-a-uuid")
    with pytest.raises(NotFound):
        client.list_gateway_calls(str(uuid.uuid4()))
