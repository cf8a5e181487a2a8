-- ctxd on PostgreSQL: the same model as the SQLite schema, laid out to be distributed by
-- session. Every table of a session's data carries `session_id` and leads its primary key
-- with it, and every foreign key between them includes it, so under Citus the tables are
-- co-located by `session_id` and a session's statements stay on one shard
-- (docs/scaling.md). Ids are UUID v7 bytes, hashes BLAKE3 bytes, times milliseconds.

CREATE TABLE sessions (
    id               BYTEA  NOT NULL PRIMARY KEY,
    tenant           TEXT   NOT NULL,
    created_at_ms    BIGINT NOT NULL,
    metadata         TEXT   NOT NULL,          -- JSON object of strings
    compaction_count BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX sessions_tenant ON sessions (tenant, id);

-- Content-addressed per session (SQLite keeps one copy for all sessions of its file).
CREATE TABLE blobs (
    session_id BYTEA  NOT NULL REFERENCES sessions (id),
    hash       BYTEA  NOT NULL,
    size       BIGINT NOT NULL,
    codec      BIGINT NOT NULL,
    data       BYTEA  NOT NULL,
    PRIMARY KEY (session_id, hash)
);

CREATE TABLE nodes (
    session_id    BYTEA  NOT NULL REFERENCES sessions (id),
    id            BYTEA  NOT NULL,
    parent_id     BYTEA,
    function_id   BYTEA,
    kind          BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    hash          BYTEA  NOT NULL,
    body          TEXT   NOT NULL,
    body_z        BYTEA,
    PRIMARY KEY (session_id, id),
    FOREIGN KEY (session_id, parent_id) REFERENCES nodes (session_id, id),
    FOREIGN KEY (session_id, function_id) REFERENCES nodes (session_id, id)
);

CREATE TABLE branches (
    session_id    BYTEA  NOT NULL REFERENCES sessions (id),
    name          TEXT   NOT NULL,
    head_id       BYTEA,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (session_id, name),
    FOREIGN KEY (session_id, head_id) REFERENCES nodes (session_id, id)
);

CREATE TABLE functions (
    session_id BYTEA NOT NULL REFERENCES sessions (id),
    id         BYTEA NOT NULL,
    head_id    BYTEA,
    closed_by  BYTEA,
    PRIMARY KEY (session_id, id),
    FOREIGN KEY (session_id, id) REFERENCES nodes (session_id, id),
    FOREIGN KEY (session_id, head_id) REFERENCES nodes (session_id, id),
    FOREIGN KEY (session_id, closed_by) REFERENCES nodes (session_id, id)
);

CREATE TABLE idempotency (
    session_id    BYTEA  NOT NULL REFERENCES sessions (id),
    key           TEXT   NOT NULL,
    request_hash  BYTEA  NOT NULL,
    response      TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (session_id, key)
);

-- Creation keys are per tenant: a retry names the key, not the session it made.
CREATE TABLE session_keys (
    tenant        TEXT   NOT NULL,
    key           TEXT   NOT NULL,
    request_hash  BYTEA  NOT NULL,
    session_id    BYTEA  NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, key)
);

CREATE TABLE compactions (
    session_id            BYTEA  NOT NULL REFERENCES sessions (id),
    id                    BYTEA  NOT NULL,
    branch                TEXT   NOT NULL,
    base_head_id          BYTEA  NOT NULL,
    covers                BYTEA  NOT NULL,
    budget                TEXT   NOT NULL,
    tokenizer             TEXT   NOT NULL,
    max_tool_result_chars BIGINT NOT NULL,
    retain_turns          BIGINT NOT NULL,
    instructions          TEXT   NOT NULL,
    tokens_before         BIGINT NOT NULL,
    state                 TEXT   NOT NULL,
    created_at_ms         BIGINT NOT NULL,
    kind                  TEXT   NOT NULL,
    rolls_over            BYTEA,
    range_from_id         BYTEA,
    range_to_id           BYTEA,
    ledger                TEXT,
    PRIMARY KEY (session_id, id)
);

-- Which session a compaction plan belongs to: CommitSummary and CancelCompaction name only
-- the plan, so this is the one lookup by another key (distributed by compaction id).
CREATE TABLE compaction_owners (
    id         BYTEA NOT NULL PRIMARY KEY,
    session_id BYTEA NOT NULL,
    tenant     TEXT  NOT NULL
);

CREATE TABLE summaries (
    session_id    BYTEA  NOT NULL REFERENCES sessions (id),
    id            BYTEA  NOT NULL,
    compaction_id BYTEA  NOT NULL,
    covers        BYTEA  NOT NULL,
    text          TEXT   NOT NULL,
    model         TEXT   NOT NULL,
    base_head_id  BYTEA  NOT NULL,
    tokens_before BIGINT NOT NULL,
    tokens_after  BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    kind          TEXT   NOT NULL,
    rolls_over    BYTEA,
    range_from_id BYTEA,
    range_to_id   BYTEA,
    ledger        TEXT,
    PRIMARY KEY (session_id, id),
    FOREIGN KEY (session_id, compaction_id) REFERENCES compactions (session_id, id)
);

CREATE TABLE compaction_events (
    session_id    BYTEA  NOT NULL REFERENCES sessions (id),
    id            BIGINT GENERATED ALWAYS AS IDENTITY,
    compaction_id BYTEA  NOT NULL,
    branch        TEXT   NOT NULL,
    kind          TEXT   NOT NULL,
    reason        TEXT,
    base_head_id  BYTEA,
    tokens_before BIGINT NOT NULL,
    tokens_after  BIGINT NOT NULL,
    summary_id    BYTEA,
    message       TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (session_id, id)
);
CREATE INDEX compaction_events_branch ON compaction_events (session_id, branch, id);

CREATE TABLE pins (
    session_id    BYTEA  NOT NULL REFERENCES sessions (id),
    seq           BIGINT GENERATED ALWAYS AS IDENTITY,
    node_id       BYTEA  NOT NULL,
    pinned        BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (session_id, seq),
    FOREIGN KEY (session_id, node_id) REFERENCES nodes (session_id, id)
);

-- The server summarizer's outputs by source: a cache shared by every session.
CREATE TABLE summarizer_outputs (
    source_key    BYTEA  NOT NULL PRIMARY KEY,
    text          TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL
);
