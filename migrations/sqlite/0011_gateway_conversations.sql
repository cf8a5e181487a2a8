-- What the gateway judges and renders a conversation's next call against (its newest forwarded
-- request's cache prefix, and where its last step was taken), one row per conversation: the
-- session's own (scope empty) or a sub-agent's (scope: its function's id). Kept in the
-- database, not in a process, so a call served by any replica finds what the one before left.
CREATE TABLE gateway_conversations (
    session_id    BLOB    NOT NULL REFERENCES sessions (id),
    scope         BLOB    NOT NULL,
    state         TEXT    NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (session_id, scope)
) WITHOUT ROWID;
