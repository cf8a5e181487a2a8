"""ctxd as a column of the peer harness (`../shared/bench/peers`, relative to the repository root).

    python ../shared/bench/peers/harness.py bench --sut-module bench/ctxd_sut.py \
        --suts raw-sqlite,openai-agents,langgraph,adk-sqlite,ctxd

The harness loads this file, imports `SystemUnderTest` from its own `suts` module (it puts its
folder on `sys.path`) and adds `REGISTRY` to its systems under test. See bench/README.md.

What the column does, per the harness's replay protocol:

- `open`: starts the release server, `ctxd serve --listen 127.0.0.1:0 --db <workdir>/ctxd.db`,
  reads the bound address from its first stdout line and opens one sync grpcio channel, using
  the generated stubs of the Python client (not its wrapper, to keep the client's cost minimal).
- `create_session`: one `CreateSession`.
- `append`: one `Append` of one node per message (the neutral trace format mapped to a
  `NodeInput`: a message with its tool calls, or a tool result).
- `load_context`: one unbounded `Render` (no budget, heuristic tokenizer, neutral format), with
  the rendered messages materialized as plain dicts, as the peers' `json.loads` does.
- `close`: reads the server's peak RSS (`VmHWM`), SIGTERMs it and checks it exits cleanly (it
  checkpoints the WAL on shutdown). `disk_paths`: the SQLite files.

Environment:

- `CTXD_BIN`: the server executable (default: `target/release/ctxd`, built if missing).
- `CTXD_BENCH_REPORT`: a file to which every run appends one JSON line with what the harness has
  no field for: the server's peak RSS and, with `CTXD_BENCH_METRICS=1`, the server's own time
  per RPC method (from its Prometheus histograms).
- `CTXD_BENCH_METRICS=1`: also start the server with `--metrics-listen 127.0.0.1:0`.
- `CTXD_BENCH_DATABASE_URL`: a PostgreSQL server (e.g. `postgres://postgres@127.0.0.1:5432/test`)
  for the `ctxd-pg` column: the same replay on a fresh database of that server (created with
  `psql` at open, dropped at close); its disk is the database's size (`pg_database_size`) read
  before the drop, reported in `$CTXD_BENCH_REPORT` (the harness measures files only).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from suts import SystemUnderTest

REPO = Path(__file__).resolve().parents[1]
STARTUP_SECONDS = 60
SHUTDOWN_SECONDS = 60

try:  # the installed client (`pip install -e clients/python`)
    from ctxd_client._proto import ctxd_pb2 as pb
    from ctxd_client._proto import ctxd_pb2_grpc as pb_grpc
except ImportError:  # or straight from this checkout
    sys.path.insert(0, str(REPO / "clients" / "python" / "src"))
    from ctxd_client._proto import ctxd_pb2 as pb
    from ctxd_client._proto import ctxd_pb2_grpc as pb_grpc

import grpc  # noqa: E402  (after the fallback above, which needs no grpc)

_MESSAGE_ROLES = {
    "system": pb.ROLE_SYSTEM,
    "developer": pb.ROLE_DEVELOPER,
    "user": pb.ROLE_USER,
    "assistant": pb.ROLE_ASSISTANT,
}
_ROLE_NAMES = {
    pb.ROLE_SYSTEM: "system",
    pb.ROLE_DEVELOPER: "developer",
    pb.ROLE_USER: "user",
    pb.ROLE_ASSISTANT: "assistant",
    pb.ROLE_TOOL: "tool",
}


def server_binary() -> Path:
    """`$CTXD_BIN`, else the release build of this checkout (built if missing)."""
    if os.environ.get("CTXD_BIN"):
        path = Path(os.environ["CTXD_BIN"])
        if not path.is_file():
            raise FileNotFoundError(f"CTXD_BIN={path} is not a file")
        return path
    path = REPO / "target" / "release" / "ctxd"
    if not path.is_file():
        subprocess.run(
            ["cargo", "build", "--release", "--bin", "ctxd"],
            cwd=REPO,
            stdout=sys.stderr,  # the harness child's stdout is its result line
            check=True,
        )
    return path


def _text_parts(text: str) -> list:
    # An assistant turn that only calls tools has no text: no part at all, as the client does.
    return [pb.ContentPart(text=text)] if text else []


def node_input(msg: dict) -> Any:
    """A neutral trace message as one `NodeInput`."""
    role = msg["role"]
    if role == "tool":
        return pb.NodeInput(
            tool_result=pb.ToolResult(
                call_id=msg["tool_call_id"],
                parts=_text_parts(msg["content"]),
                is_error=bool(msg.get("is_error")),
            )
        )
    if role not in _MESSAGE_ROLES:
        raise ValueError(f"unknown role {role!r}")
    calls = [
        pb.ToolCall(call_id=tc["id"], name=tc["name"], arguments_json=tc["arguments"])
        for tc in msg.get("tool_calls") or ()
    ]
    return pb.NodeInput(
        message=pb.Message(
            role=_MESSAGE_ROLES[role], parts=_text_parts(msg["content"]), tool_calls=calls
        )
    )


_TOOL = pb.ROLE_TOOL
_ASSISTANT = pb.ROLE_ASSISTANT


def materialize(m: Any) -> dict:
    """A rendered message as a neutral dict (role, content, tool_calls / tool_call_id).

    Each field read of a parsed message builds a Python object (a repeated field a wrapper, a
    string a new `str`), so fields are read once and only where the role can carry them: tool
    calls on assistant messages, the call id and error flag on tool messages.
    """
    role = m.role
    parts = m.parts
    content = parts[0].text if len(parts) == 1 else "".join([p.text for p in parts])
    if role == _TOOL:
        d = {"role": "tool", "content": content, "tool_call_id": m.tool_call_id}
        if m.is_error:
            d["is_error"] = True
        return d
    d = {"role": _ROLE_NAMES[role], "content": content}
    if role == _ASSISTANT:
        calls = m.tool_calls
        if calls:
            d["tool_calls"] = [
                {"id": c.call_id, "name": c.name, "arguments": c.arguments_json} for c in calls
            ]
    return d


HEALTH_CHECKS = 300


def _health_check_p50_ms(channel: grpc.Channel) -> float:
    """p50 of a `grpc.health.v1` check on `channel` (untimed by the harness): what any unary
    call costs from this client with nothing behind it, the part of an append that is not the
    store's."""
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    times = []
    for _ in range(HEALTH_CHECKS):
        start = time.perf_counter()
        check(b"")  # an empty HealthCheckRequest: the server's overall status
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1000


def _vm_hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _scrape_rpc_durations(address: str) -> dict:
    """Per method: count and sum (seconds) of `ctxd_rpc_duration_seconds`, and its buckets."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict = {}
    pattern = re.compile(
        r"^ctxd_rpc_duration_seconds_(count|sum|bucket)\{(.*)\} (\S+)$", re.MULTILINE
    )
    for kind, labels, value in pattern.findall(text):
        method = re.search(r'method="([^"]*)"', labels).group(1).rsplit("/", 1)[-1]
        entry = out.setdefault(method, {"buckets": {}})
        if kind == "bucket":
            le = re.search(r'le="([^"]*)"', labels).group(1)
            entry["buckets"][le] = int(float(value))
        else:
            entry[kind] = float(value)
    return out


class CtxdSUT(SystemUnderTest):
    name = "ctxd"

    def database(self, workdir: Path) -> str:
        """What `--db` gets: the SQLite file in the work dir."""
        self.db = workdir / "ctxd.db"
        return str(self.db)

    def open(self, workdir: Path) -> None:
        super().open(workdir)
        db = self.database(workdir)
        self.metrics = os.environ.get("CTXD_BENCH_METRICS") == "1"
        self.server_peak_rss_mb: float | None = None
        self.server_rpc_durations: dict | None = None
        self.log_path = workdir / "ctxd.log"
        self._log = self.log_path.open("w")
        cmd = [str(server_binary()), "serve", "--listen", "127.0.0.1:0", "--db", db]
        if self.metrics:
            cmd += ["--metrics-listen", "127.0.0.1:0"]
        self.process = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=self._log,
            bufsize=0,  # raw pipe: select() below must see every byte not yet read
            # Only the flags above configure it, whatever CTXD_* the caller has set.
            env={k: v for k, v in os.environ.items() if not k.startswith("CTXD_")},
        )
        # A replay that fails leaves the harness child without calling close(): stop the server
        # when the child exits anyway.
        atexit.register(self._kill_if_running)
        self._stdout = b""
        self.address = self._read_line(r"ctxd listening on (\S+)")
        self.metrics_address = self._read_line(r"ctxd metrics on (\S+)") if self.metrics else None
        self.channel = grpc.insecure_channel(self.address)
        grpc.channel_ready_future(self.channel).result(timeout=STARTUP_SECONDS)
        stub = pb_grpc.ContextStoreStub(self.channel)
        self._create, self._append, self._render = (
            stub.CreateSession,
            stub.Append,
            stub.Render,
        )
        # Warm the connection and the server's read path without writing anything.
        stub.ListSessions(pb.ListSessionsRequest(page_size=1))
        self.health_check_p50_ms = _health_check_p50_ms(self.channel)
        self.sid = ""

    def _kill_if_running(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _read_line(self, pattern: str) -> str:
        """The next stdout line of the server, which must match `pattern` (group 1 returned)."""
        fd = self.process.stdout.fileno()
        while b"\n" not in self._stdout:
            ready, _, _ = select.select([fd], [], [], STARTUP_SECONDS)
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:
                break
            self._stdout += chunk
        line, _, self._stdout = self._stdout.partition(b"\n")
        match = re.fullmatch(pattern, line.decode(errors="replace"))
        if not match:
            self.process.kill()
            self.process.wait()
            self._log.close()
            raise RuntimeError(
                f"ctxd did not start (stdout line {line!r}); its log: {self.log_path.read_text()}"
            )
        return match.group(1)

    def create_session(self) -> str:
        self.sid = self._create(pb.CreateSessionRequest()).session_id
        self.n = 0
        return self.sid

    def append(self, msg: dict) -> None:
        request = pb.AppendRequest(session_id=self.sid, nodes=[node_input(msg)])
        try:
            self._append(request)
        except grpc.RpcError as e:
            # Name the message: a trace that breaks the pairing rules shows up here.
            raise RuntimeError(
                f"ctxd Append of message #{self.n} (role {msg['role']}) failed: "
                f"{e.code().name}: {e.details()}"
            ) from None
        self.n += 1

    def load_context(self) -> list[dict]:
        r = self._render(
            pb.RenderRequest(
                session_id=self.sid,
                branch="main",
                tokenizer="heuristic",
                format=pb.FORMAT_NEUTRAL,
            )
        )
        return [materialize(m) for m in r.messages]

    def verify(self, ctx: Any, n_appended: int) -> bool:
        return len(ctx) == n_appended

    def close(self) -> None:
        self.server_peak_rss_mb = _vm_hwm_mb(self.process.pid)
        if self.metrics_address:
            self.server_rpc_durations = _scrape_rpc_durations(self.metrics_address)
        self.channel.close()
        self.process.terminate()
        try:
            code = self.process.wait(timeout=SHUTDOWN_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise RuntimeError("ctxd did not stop within a minute of SIGTERM") from None
        finally:
            self._log.close()
            self.process.stdout.close()
        if code != 0:
            raise RuntimeError(f"ctxd exited with {code}; its log: {self.log_path.read_text()}")
        # The harness has no field for another process's RSS: print it (stderr: the child's
        # stdout is its result line), keep it as an attribute, and append it to
        # $CTXD_BENCH_REPORT if set.
        print(f"ctxd server peak RSS (VmHWM): {self.server_peak_rss_mb:.1f} MB", file=sys.stderr)
        report = os.environ.get("CTXD_BENCH_REPORT")
        if report:
            line = {
                "sut": self.name,
                # The harness's work dir is <scratch>/<workload with ':' as '_'>/<sut>.
                "workload": self.workdir.parent.name,
                "server_peak_rss_mb": self.server_peak_rss_mb,
                "server_rpc_durations": self.server_rpc_durations,
                "health_check_p50_ms": self.health_check_p50_ms,
                **self.extra_report(),
            }
            Path(report).parent.mkdir(parents=True, exist_ok=True)
            with open(report, "a") as f:
                f.write(json.dumps(line) + "\n")

    def extra_report(self) -> dict:
        return {}

    def disk_paths(self) -> list[Path]:
        return sorted(p for p in self.workdir.glob("ctxd.db*") if p.is_file())


def _psql(server: str, sql: str) -> str:
    done = subprocess.run(
        ["psql", server, "-v", "ON_ERROR_STOP=1", "-Atc", sql],
        capture_output=True,
        text=True,
        timeout=STARTUP_SECONDS,
    )
    if done.returncode != 0:
        raise RuntimeError(f"psql {sql!r}: {done.stderr.strip()}")
    return done.stdout.strip()


class CtxdPostgresSUT(CtxdSUT):
    """The same column on PostgreSQL: a fresh database per run on $CTXD_BENCH_DATABASE_URL."""

    name = "ctxd-pg"

    def database(self, workdir: Path) -> str:
        self.server = os.environ.get("CTXD_BENCH_DATABASE_URL", "")
        if not self.server.startswith(("postgres://", "postgresql://")):
            raise RuntimeError("ctxd-pg needs CTXD_BENCH_DATABASE_URL=postgres://… (a server)")
        self.dbname = f"ctxd_peers_{uuid.uuid4().hex}"
        _psql(self.server, f"CREATE DATABASE {self.dbname}")
        atexit.register(self._drop)
        self.pg_bytes: int | None = None
        base, _, _ = self.server.partition("?")
        return base.rsplit("/", 1)[0] + "/" + self.dbname

    def close(self) -> None:
        # Read while the server still holds it: the size of everything it stored.
        self.pg_bytes = int(_psql(self.server, f"SELECT pg_database_size('{self.dbname}')"))
        print(f"ctxd-pg database size: {self.pg_bytes / 2**20:.1f} MiB", file=sys.stderr)
        super().close()
        self._drop()

    def _drop(self) -> None:
        if getattr(self, "dbname", None):
            _psql(self.server, f"DROP DATABASE IF EXISTS {self.dbname} WITH (FORCE)")
            self.dbname = None

    def extra_report(self) -> dict:
        return {"pg_database_bytes": getattr(self, "pg_bytes", None)}

    def disk_paths(self) -> list[Path]:
        return []


REGISTRY = {"ctxd": CtxdSUT, "ctxd-pg": CtxdPostgresSUT}
