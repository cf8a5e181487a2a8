-- Idempotency keys of the writes that create a session (CreateSession, ImportSession): a retry
-- with the same key returns the session the first call created. Keys are per tenant.
CREATE TABLE session_keys (
    tenant        TEXT NOT NULL,
    key           TEXT NOT NULL,
    request_hash  BLOB NOT NULL,
    session_id    BLOB NOT NULL REFERENCES sessions (id),
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
) WITHOUT ROWID;
