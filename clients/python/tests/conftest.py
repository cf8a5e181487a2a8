"""Fixtures: a real ctxd server on 127.0.0.1:0 over a SQLite file in a temp dir.

The server binary is `$CTXD_BIN` if set, else built from this repository with
`cargo build --release --bin ctxd`. The bound address is read from the one line the server
prints on stdout, so there are no fixed ports and no sleeps.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxd_client import Client, Session

REPO = Path(__file__).resolve().parents[3]
STARTUP_SECONDS = 60


@pytest.fixture(scope="session")
def ctxd_bin() -> Path:
    """The server executable: `$CTXD_BIN`, or a release build of this checkout."""
    if os.environ.get("CTXD_BIN"):
        path = Path(os.environ["CTXD_BIN"])
        assert path.is_file(), f"CTXD_BIN={path} is not a file"
        return path
    # Cargo names the executable it built on stdout; asking it copes with CARGO_TARGET_DIR.
    build = subprocess.run(
        [
            "cargo",
            "build",
            "--release",
            "--bin",
            "ctxd",
            "--message-format=json-render-diagnostics",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert build.returncode == 0, "cargo build --release --bin ctxd failed (see stderr above)"
    for line in build.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message.get("executable"):
            if message["target"]["name"] == "ctxd":
                return Path(message["executable"])
    raise AssertionError("cargo build did not name the ctxd executable")


class Server:
    """A running `ctxd serve`; `stop()` terminates it and checks that it shut down cleanly."""

    def __init__(self, binary: Path, workdir: Path, *extra: str) -> None:
        self.log_path = workdir / "ctxd.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--db", workdir / "ctxd.db", *extra],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            # Only the flags given here configure it, whatever CTXD_* the caller has set.
            env={k: v for k, v in os.environ.items() if not k.startswith("CTXD_")},
        )
        self.address = self._read_address()

    def _read_address(self) -> str:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], STARTUP_SECONDS)
        line = self.process.stdout.readline() if ready else ""
        match = re.fullmatch(r"ctxd listening on (\S+)\n", line)
        if not match:
            self.process.kill()
            self.process.wait()
            self._log.close()
            pytest.fail(
                f"ctxd did not start (first stdout line {line!r}); its log:\n"
                + self.log_path.read_text()
            )
        return match.group(1)

    def stop(self) -> None:
        self.process.terminate()
        try:
            code = self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        finally:
            self._log.close()
        assert code == 0, f"ctxd exited with {code}; its log:\n{self.log_path.read_text()}"


@pytest.fixture(scope="session")
def server(ctxd_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of a server shared by all tests (each test uses its own sessions)."""
    s = Server(ctxd_bin, tmp_path_factory.mktemp("ctxd"))
    yield s.address
    s.stop()


@pytest.fixture
def client(server: str) -> Iterator[Client]:
    with Client(server, timeout=30) as c:
        yield c


@pytest.fixture
def session(client: Client) -> Session:
    return client.create_session({"test": "python-client"})


class RpcRecorder(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Records the name of every unary and bidirectional RPC a client makes, in order."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.methods.append(details.method.rsplit("/", 1)[-1])
        return continuation(details, request)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        self.methods.append(details.method.rsplit("/", 1)[-1])
        return continuation(details, requests)

    def writes(self) -> list[str]:
        """The appends among them: `Append` and `AppendStream`."""
        return [m for m in self.methods if m in ("Append", "AppendStream")]


@pytest.fixture
def recorded(server: str) -> Iterator[tuple[Client, RpcRecorder]]:
    """A client whose RPCs are recorded: what a higher-level call sends to the server."""
    recorder = RpcRecorder()
    channel = grpc.insecure_channel(server)
    with Client(channel=grpc.intercept_channel(channel, recorder), timeout=30) as c:
        yield c, recorder
    channel.close()


class FakeSummarizer:
    """An OpenAI-compatible chat-completions endpoint that answers every request with `reply`
    and records what it was asked, for `Compact` through the server's own summarizer."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                fake.requests.append({"path": self.path, "body": json.loads(body)})
                answer = json.dumps(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": fake.reply},
                                "finish_reason": "stop",
                            }
                        ],
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="session")
def summarizer() -> Iterator[FakeSummarizer]:
    fake = FakeSummarizer("The user asked about several files; all of them were fine.")
    yield fake
    fake.close()


@pytest.fixture(scope="session")
def summarizing_server(
    ctxd_bin: Path, tmp_path_factory: pytest.TempPathFactory, summarizer: FakeSummarizer
) -> Iterator[str]:
    """A second server whose `Compact` calls the fake summarizer."""
    s = Server(
        ctxd_bin,
        tmp_path_factory.mktemp("ctxd-summarizing"),
        "--summarizer-url",
        summarizer.url,
        "--summarizer-model",
        "fake-model",
    )
    yield s.address
    s.stop()
