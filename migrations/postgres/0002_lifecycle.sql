-- Deleting sessions: every table is keyed by session first, so a session's rows are one range
-- each; the two tables keyed otherwise get an index by session, and a tombstone stays for the
-- audit.

CREATE INDEX compaction_owners_session ON compaction_owners (session_id);
CREATE INDEX session_keys_session ON session_keys (session_id);

CREATE TABLE tombstones (
    session_id    BYTEA  NOT NULL PRIMARY KEY,
    tenant        TEXT   NOT NULL,
    deleted_by    TEXT   NOT NULL,
    deleted_at_ms BIGINT NOT NULL,
    nodes         BIGINT NOT NULL,
    branches      BIGINT NOT NULL,
    summaries     BIGINT NOT NULL
);

-- The plans a deletion found open, so their commit is answered as stale, not as unknown
-- (distributed by compaction id, as compaction_owners).
CREATE TABLE tombstone_plans (
    compaction_id BYTEA NOT NULL PRIMARY KEY,
    session_id    BYTEA NOT NULL
);

-- A deletion removes a session's nodes in one statement, and PostgreSQL checks a foreign key
-- of a table on itself once per removed row by scanning the session's rows: quadratic. The
-- store checks a node's parent and function in the same transaction before it writes one.
ALTER TABLE nodes DROP CONSTRAINT IF EXISTS nodes_session_id_parent_id_fkey;
ALTER TABLE nodes DROP CONSTRAINT IF EXISTS nodes_session_id_function_id_fkey;
