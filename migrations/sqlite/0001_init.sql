-- Sessions, the immutable node DAG, content-addressed blobs, branch refs, function scopes and
-- idempotency records. Ids are UUID v7 as 16-byte blobs; hashes are 32-byte BLAKE3.

CREATE TABLE sessions (
    id               BLOB PRIMARY KEY,
    created_at_ms    INTEGER NOT NULL,
    metadata         TEXT NOT NULL,          -- JSON object of strings
    compaction_count INTEGER NOT NULL DEFAULT 0
);

-- One row per distinct byte string: the same file read ten times costs one copy.
CREATE TABLE blobs (
    id   INTEGER PRIMARY KEY,
    hash BLOB NOT NULL UNIQUE,
    size INTEGER NOT NULL,
    data BLOB NOT NULL
);

CREATE TABLE nodes (
    id            BLOB PRIMARY KEY,
    session_id    BLOB NOT NULL REFERENCES sessions (id),
    parent_id     BLOB REFERENCES nodes (id),
    -- The function_call node whose internal chain holds this node; NULL at top level.
    function_id   BLOB REFERENCES nodes (id),
    kind          INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    hash          BLOB NOT NULL,
    body          TEXT NOT NULL              -- JSON; content parts refer to blobs by hash
);
CREATE INDEX nodes_session ON nodes (session_id);
CREATE INDEX nodes_parent ON nodes (parent_id);

CREATE TABLE branches (
    session_id    BLOB NOT NULL REFERENCES sessions (id),
    name          TEXT NOT NULL,
    head_id       BLOB REFERENCES nodes (id),
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (session_id, name)
) WITHOUT ROWID;

-- A function (sub-agent) scope, opened by its function_call node.
CREATE TABLE functions (
    id         BLOB PRIMARY KEY REFERENCES nodes (id),
    session_id BLOB NOT NULL REFERENCES sessions (id),
    head_id    BLOB REFERENCES nodes (id),  -- newest node of its chain; NULL while empty
    closed_by  BLOB REFERENCES nodes (id)   -- the function_result that closed it
) WITHOUT ROWID;

CREATE TABLE idempotency (
    session_id    BLOB NOT NULL REFERENCES sessions (id),
    key           TEXT NOT NULL,
    request_hash  BLOB NOT NULL,
    response      TEXT NOT NULL,            -- JSON of the first answer
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (session_id, key)
) WITHOUT ROWID;
