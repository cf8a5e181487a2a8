-- What the gateway judges and renders a conversation's next call against (its newest forwarded
-- request's cache prefix, and where its last step was taken), one row per conversation: the
-- session's own (scope empty) or a sub-agent's (scope: its function's id). Kept in the
-- database, not in a process, so a call served by any replica finds what the one before left.
-- On Citus it is distributed by session_id with the session's other tables (ctxd serve does it).
CREATE TABLE gateway_conversations (
    session_id    BYTEA  NOT NULL REFERENCES sessions (id),
    scope         BYTEA  NOT NULL,
    state         TEXT   NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (session_id, scope)
);
