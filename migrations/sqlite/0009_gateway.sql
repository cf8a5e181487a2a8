-- The model gateway: a resent history is found by the hash of its newest stored message, so
-- nodes are indexed by (session, hash) (a hash names one position of one chain: it covers the
-- enclosing function's hash too); and every call it forwarded records what the
-- client sent, what went upstream and what the provider reported using.
CREATE INDEX nodes_session_hash ON nodes (session_id, hash);

CREATE TABLE gateway_calls (
    session_id         BLOB    NOT NULL REFERENCES sessions (id),
    id                 BLOB    NOT NULL,
    at_ms              INTEGER NOT NULL,
    api                TEXT    NOT NULL,
    model              TEXT    NOT NULL,
    client_tokens      INTEGER NOT NULL,
    forwarded_tokens   INTEGER NOT NULL,
    input_tokens       INTEGER NOT NULL,
    cache_read_tokens  INTEGER NOT NULL,
    cache_write_tokens INTEGER NOT NULL,
    output_tokens      INTEGER NOT NULL,
    PRIMARY KEY (session_id, id)
) WITHOUT ROWID;
