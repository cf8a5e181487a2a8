"""The methods of the lifecycle, reading and admin RPCs: list_sessions, get_nodes, branches,
delete_session, export_session (every format, as chunks and to a file), import_session,
backup_database and collect_garbage."""

from __future__ import annotations

import io
import json
import sqlite3
import uuid
from pathlib import Path

import pytest

from ctxd_client import (
    AlreadyExists,
    Client,
    Conflict,
    InvalidArgument,
    NotFound,
    Session,
    assistant_message,
    tool_result,
    user_message,
)


def conversation(client: Client, session: Session) -> list[str]:
    """A user turn with one tool call, its result (pinned) and the answer; the node ids."""
    return client.append(
        session,
        [
            user_message("What is in README.md?"),
            assistant_message("Reading it.", [{"id": "c1", "name": "read", "arguments": {}}]),
            tool_result("c1", "# ctxd", pinned=True),
            assistant_message("A title."),
        ],
    ).node_ids


def exported(client: Client, session: Session, format: str, branch: str = "main") -> bytes:
    return b"".join(c.data for c in client.export_session(session, format, branch))  # type: ignore[arg-type]


def test_list_sessions_pages_newest_first(client: Client) -> None:
    mine = [client.create_session({"page": str(i)}).id for i in range(3)]
    first = client.list_sessions(page_size=2)
    assert [s.id for s in first.sessions] == mine[::-1][:2] and first.next_page_token
    second = client.list_sessions(page_size=2, page_token=first.next_page_token)
    assert second.sessions[0].id == mine[0]
    assert second.sessions[0].metadata == {"page": "0"}
    with pytest.raises(InvalidArgument):
        client.list_sessions(page_token="not a token")


def test_get_nodes_in_the_order_asked(client: Client, session: Session) -> None:
    ids = conversation(client, session)
    nodes = client.get_nodes(session, ids[2], ids[0])
    assert [n.id for n in nodes] == [ids[2], ids[0]]
    assert nodes[0].kind == "tool_result" and nodes[0].pinned
    assert nodes[1].content["content"] == "What is in README.md?"
    with pytest.raises(NotFound):
        client.get_nodes(session, str(uuid.uuid4()))


def test_branches_list_reset_and_delete(client: Client, session: Session) -> None:
    ids = conversation(client, session)
    client.create_branch(session, "retry", ids[1])
    assert {b.name: b.head_id for b in client.list_branches(session)} == {
        "main": ids[-1],
        "retry": ids[1],
    }
    # reset_branch moves the head back (nodes untouched), as a compare-and-swap when asked.
    moved = client.reset_branch(session, "main", ids[0], expected_head_id=ids[-1])
    assert moved.head_id == ids[0] and client.log(session)[0].id == ids[0]
    with pytest.raises(Conflict):
        client.reset_branch(session, "main", ids[-1], expected_head_id=ids[-1])
    assert client.get_nodes(session, ids[-1])[0].id == ids[-1]

    client.delete_branch(session, "retry")
    assert [b.name for b in client.list_branches(session)] == ["main"]
    with pytest.raises(NotFound):
        client.delete_branch(session, "retry")


def test_delete_session_leaves_a_tombstone(client: Client, session: Session) -> None:
    conversation(client, session)
    client.create_branch(session, "other")
    deleted = client.delete_session(session)
    assert not deleted.already_deleted
    t = deleted.tombstone
    assert (t.session_id, t.nodes, t.branches, t.summaries, t.deleted_by) == (
        session.id,
        4,
        2,
        0,
        "",
    )
    assert t.deleted_at_unix_ms >= session.created_at_unix_ms
    with pytest.raises(NotFound):
        client.get_session(session)
    again = client.delete_session(session.id)
    assert again.already_deleted and again.tombstone == t
    with pytest.raises(NotFound):
        client.delete_session(str(uuid.uuid4()))


def test_export_ctxd_jsonl_imports_back_the_same_history(
    client: Client, session: Session, tmp_path: Path
) -> None:
    ids = conversation(client, session)
    chunks = list(client.export_session(session))
    assert chunks[0].branches[0].head_id == ids[-1]
    data = b"".join(c.data for c in chunks)
    records = [json.loads(line) for line in data.decode().splitlines()]
    assert records[0]["ctxd"] == "session"

    # From bytes, with the format detected, and from a file written by export_session_to.
    imported = client.import_session(data, metadata={"copy": "1"})
    assert (imported.format, imported.nodes, imported.warnings) == ("ctxd_jsonl", 4, [])
    head = client.get_session(session).branch("main")
    copy = imported.session.branch("main")
    assert head is not None and copy is not None and copy.head_hash == head.head_hash

    path = tmp_path / "session.jsonl"
    written = client.export_session_to(session, path)
    assert (written.path, written.bytes) == (str(path), len(data))
    assert path.read_bytes() == data and list(tmp_path.iterdir()) == [path]
    again = client.import_session(path, "ctxd_jsonl", idempotency_key=f"k-{uuid.uuid4()}")
    assert again.session.branch("main").head_hash == head.head_hash  # type: ignore[union-attr]


def test_export_one_branch_in_the_provider_formats(client: Client, session: Session) -> None:
    ids = conversation(client, session)
    client.create_branch(session, "short", ids[0])

    messages = json.loads(exported(client, session, "openai_messages"))
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "# ctxd"}
    assert json.loads(exported(client, session, "openai_messages", "short")) == [
        {"role": "user", "content": "What is in README.md?"}
    ]
    # A format without pins says what it left out, on the first chunk.
    first = next(client.export_session(session, "openai_messages"))
    assert any("pin" in w for w in first.warnings)

    claude = exported(client, session, "claude_code_jsonl")
    lines = [json.loads(line) for line in claude.decode().splitlines()]
    assert [line["type"] for line in lines][:2] == ["user", "assistant"]
    # Each provider format reads back as the same conversation.
    openai = json.dumps(messages).encode()
    for data, format in ((claude, "claude_code_jsonl"), (openai, "openai_messages")):
        back = client.import_session(io.BytesIO(data), format)  # type: ignore[arg-type]
        assert back.format == format and back.nodes == 4
        texts = [m["content"] for m in client.render(back.session).messages]
        assert texts == ["What is in README.md?", "Reading it.", "# ctxd", "A title."]


def test_export_and_import_errors(client: Client, session: Session, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="format"):
        client.export_session(session, "pdf")  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        list(client.export_session(str(uuid.uuid4())))
    # A failed export leaves no file behind, not even a partial one.
    with pytest.raises(NotFound):
        client.export_session_to(str(uuid.uuid4()), tmp_path / "gone.jsonl")
    assert list(tmp_path.iterdir()) == []

    with pytest.raises(InvalidArgument, match="line 2"):
        client.import_session([b'{"role": "user", "content": "hi"}\n', b"{not json\n"])
    with pytest.raises(FileNotFoundError):
        client.import_session(tmp_path / "missing.jsonl")


def test_backup_database_writes_a_sqlite_copy(
    client: Client, session: Session, tmp_path: Path
) -> None:
    client.append_user(session, "kept in the backup")
    to = tmp_path / "backup.db"
    backup = client.backup_database(str(to))
    assert backup.path == str(to) and backup.bytes == to.stat().st_size > 0
    with sqlite3.connect(f"file:{to}?mode=ro", uri=True) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with pytest.raises(AlreadyExists):
        client.backup_database(to)
    with pytest.raises(InvalidArgument, match="absolute"):
        client.backup_database("relative.db")


def test_collect_garbage_reports_the_store(client: Client) -> None:
    doomed = client.create_session()
    # Unique content: a blob another session shares would not be freed.
    client.append_user(doomed, uuid.uuid4().hex * 6_000)
    client.delete_session(doomed)
    report = client.collect_garbage()
    assert report.sessions >= 1 and report.tombstones >= 1
    assert report.database_bytes > 0 and report.free_bytes < report.database_bytes
    # The deleted session's pages were given back (SQLite): the file is smaller for it.
    assert report.released_bytes > 0
