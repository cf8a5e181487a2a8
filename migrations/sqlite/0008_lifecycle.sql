-- Deleting sessions. A session's rows are found by its id (nodes by an index again: 0006
-- dropped it when nodes were never deleted), content blobs shared between sessions are counted
-- (`blob_refs`, one row per session and blob, kept by the committer; `blobs.refs` by the
-- triggers), and a tombstone stays for the audit.

CREATE INDEX nodes_session ON nodes (session_id);
CREATE INDEX compactions_session ON compactions (session_id);
CREATE INDEX session_keys_session ON session_keys (session_id);

CREATE TABLE blob_refs (
    session_id BLOB NOT NULL,
    hash       BLOB NOT NULL,
    PRIMARY KEY (session_id, hash)
) WITHOUT ROWID;

-- Sessions referring to the blob. Filled for the blobs stored before this migration when the
-- store opens (their references are inside node bodies, some compressed).
ALTER TABLE blobs ADD COLUMN refs INTEGER NOT NULL DEFAULT 0;

CREATE TRIGGER blob_refs_count AFTER INSERT ON blob_refs BEGIN
    UPDATE blobs SET refs = refs + 1 WHERE hash = NEW.hash;
END;

-- The last session referring to a blob takes it along.
CREATE TRIGGER blob_refs_release AFTER DELETE ON blob_refs BEGIN
    UPDATE blobs SET refs = refs - 1 WHERE hash = OLD.hash;
    DELETE FROM blobs WHERE hash = OLD.hash AND refs <= 0;
END;

CREATE TABLE tombstones (
    session_id      BLOB PRIMARY KEY,
    tenant          TEXT NOT NULL,
    deleted_by      TEXT NOT NULL,
    deleted_at_ms   INTEGER NOT NULL,
    nodes           INTEGER NOT NULL,
    branches        INTEGER NOT NULL,
    summaries       INTEGER NOT NULL
) WITHOUT ROWID;

-- The plans a deletion found open, so their commit is answered as stale, not as unknown.
CREATE TABLE tombstone_plans (
    compaction_id BLOB PRIMARY KEY,
    session_id    BLOB NOT NULL
) WITHOUT ROWID;
