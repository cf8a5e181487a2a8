-- Deleting a session by each table's own distribution key: a session remembers the creation
-- key it was made with, and the server summarizer's sources it used, so DeleteSession removes
-- its `session_keys` row by (tenant, key) and its `summarizer_outputs` rows by source key
-- instead of searching those tables (distributed by other keys) by session.

ALTER TABLE sessions ADD COLUMN create_key TEXT;

-- No foreign key to `sessions`: on a database already distributed, Citus refuses a plain table
-- referring to a distributed one, and ctxd distributes this table after the migrations ran.
CREATE TABLE summarizer_sources (
    session_id BYTEA NOT NULL,
    source_key BYTEA NOT NULL,
    PRIMARY KEY (session_id, source_key)
);

-- The rows stored before. On one database, two set-based statements; on a database already
-- distributed (by hand, with Citus), a loop of one-row statements, each routed by its key, as
-- Citus refuses a join between tables distributed by different keys.
DO $$
DECLARE
    distributed BOOLEAN := false;
    k RECORD;
    o RECORD;
    s RECORD;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_dist_partition
                                WHERE logicalrelid = to_regclass(''sessions''))'
            INTO distributed;
    END IF;
    IF NOT distributed THEN
        UPDATE sessions SET create_key = k2.key
            FROM session_keys k2 WHERE k2.session_id = sessions.id;
        INSERT INTO summarizer_sources (session_id, source_key)
            SELECT DISTINCT m.session_id, u.source_key
            FROM summaries m JOIN summarizer_outputs u ON u.text = m.text
            ON CONFLICT DO NOTHING;
        RETURN;
    END IF;
    FOR k IN SELECT session_id, key FROM session_keys LOOP
        UPDATE sessions SET create_key = k.key WHERE id = k.session_id;
    END LOOP;
    FOR o IN SELECT source_key, text FROM summarizer_outputs LOOP
        FOR s IN SELECT DISTINCT session_id FROM summaries WHERE text = o.text LOOP
            INSERT INTO summarizer_sources (session_id, source_key)
            VALUES (s.session_id, o.source_key) ON CONFLICT DO NOTHING;
        END LOOP;
    END LOOP;
END
$$;
