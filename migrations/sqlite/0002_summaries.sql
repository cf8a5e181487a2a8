-- Summaries as overlays, the compaction plans behind them, and the audit trail of every
-- compaction. Node id lists are packed: 16 bytes an id, in order.

CREATE TABLE compactions (
    id                    BLOB PRIMARY KEY,
    session_id            BLOB NOT NULL REFERENCES sessions (id),
    branch                TEXT NOT NULL,
    base_head_id          BLOB NOT NULL REFERENCES nodes (id),
    prior_summary_id      BLOB,
    covers                BLOB NOT NULL,
    budget                TEXT NOT NULL,    -- JSON: the five budget parts
    tokenizer             TEXT NOT NULL,
    max_tool_result_chars INTEGER NOT NULL,
    retain_turns          INTEGER NOT NULL,
    instructions          TEXT NOT NULL,
    tokens_before         INTEGER NOT NULL,
    state                 TEXT NOT NULL,    -- open | applied | cancelled
    created_at_ms         INTEGER NOT NULL
);

CREATE TABLE summaries (
    id            BLOB PRIMARY KEY,
    session_id    BLOB NOT NULL REFERENCES sessions (id),
    compaction_id BLOB NOT NULL REFERENCES compactions (id),
    prior_id      BLOB REFERENCES summaries (id),
    covers        BLOB NOT NULL,
    text          TEXT NOT NULL,
    model         TEXT NOT NULL,
    base_head_id  BLOB NOT NULL REFERENCES nodes (id),
    tokens_before INTEGER NOT NULL,
    tokens_after  INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE INDEX summaries_session ON summaries (session_id, created_at_ms);

CREATE TABLE compaction_events (
    id            INTEGER PRIMARY KEY,
    session_id    BLOB NOT NULL REFERENCES sessions (id),
    compaction_id BLOB NOT NULL REFERENCES compactions (id),
    branch        TEXT NOT NULL,
    kind          TEXT NOT NULL,            -- prepared | committed | rejected | cancelled
    reason        TEXT,                     -- applied | empty | no_gain | stale | cancelled | failed
    base_head_id  BLOB,
    tokens_before INTEGER NOT NULL,
    tokens_after  INTEGER NOT NULL,
    summary_id    BLOB,
    message       TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE INDEX compaction_events_session ON compaction_events (session_id, branch, id);

-- What the server's summarizer wrote for an exact source, so the same source is never sent
-- to the model twice.
CREATE TABLE summarizer_outputs (
    source_key    BLOB PRIMARY KEY,
    text          TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
);
