-- The model gateway: a resent history is found by the hash of its newest stored message, so
-- nodes are indexed by (session, hash) (a hash names one position of one chain: it covers the
-- enclosing function's hash too); and every call it forwarded records what the
-- client sent, what went upstream and what the provider reported using (keyed by session
-- first, like every table of a session's data).
CREATE INDEX nodes_session_hash ON nodes (session_id, hash);

CREATE TABLE gateway_calls (
    session_id         BYTEA  NOT NULL REFERENCES sessions (id),
    id                 BYTEA  NOT NULL,
    at_ms              BIGINT NOT NULL,
    api                TEXT   NOT NULL,
    model              TEXT   NOT NULL,
    client_tokens      BIGINT NOT NULL,
    forwarded_tokens   BIGINT NOT NULL,
    input_tokens       BIGINT NOT NULL,
    cache_read_tokens  BIGINT NOT NULL,
    cache_write_tokens BIGINT NOT NULL,
    output_tokens      BIGINT NOT NULL,
    PRIMARY KEY (session_id, id)
);
