-- Appends to branches whose heads the committer remembers, in one call: the blobs and nodes
-- are written, then each head moves only if it is still the expected one (in the order given,
-- the batch's lock order; the UPDATE waits for a concurrent writer of the row and checks the
-- head it then finds). A head that moved on raises SQLSTATE CTXHM, which undoes the call, so
-- nothing is written; the batch is then checked again the usual way. One statement, so one
-- commit or nothing: the work of a plain INSERT and UPDATE, no locking read first. Returns 1.
--
-- On Citus it is a distributed function co-located with `sessions` and delegated by
-- `p_session` (ctxd serve makes it one): sent to the coordinator, or straight to the worker
-- that holds that session's shard, it runs whole on that worker, and every target of the call
-- is a session whose shard that worker holds (the committer groups a batch by worker), so it is
-- one round trip and one local transaction where the statements one by one were six per
-- session through the coordinator. Rows go in one statement each, parents first, which keeps
-- every statement a single-shard one inside the delegated call.
CREATE FUNCTION ctxd_append_at_once(
    p_session  BYTEA,
    t_session  BYTEA[],
    t_branch   TEXT[],
    t_expected BYTEA[],
    t_head     BYTEA[],
    t_now      BIGINT[],
    b_session  BYTEA[],
    b_hash     BYTEA[],
    b_size     BIGINT[],
    b_codec    BIGINT[],
    b_data     BYTEA[],
    n_session  BYTEA[],
    n_id       BYTEA[],
    n_parent   BYTEA[],
    n_function BYTEA[],
    n_kind     BIGINT[],
    n_created  BIGINT[],
    n_hash     BYTEA[],
    n_body     TEXT[],
    n_body_z   BYTEA[]
) RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    -- Every value a statement uses is a plain variable: an array element in a statement Citus
    -- routes crashed a Citus 13.2 server (as the distribution column's value or as one it
    -- writes).
    v_session BYTEA;
    v_branch  TEXT;
    v_old     BYTEA;
    v_new     BYTEA;
    v_now     BIGINT;
    v_hash    BYTEA;
    v_size    BIGINT;
    v_codec   BIGINT;
    v_data    BYTEA;
    v_id      BYTEA;
    v_parent  BYTEA;
    v_func    BYTEA;
    v_kind    BIGINT;
    v_body    TEXT;
    v_body_z  BYTEA;
BEGIN
    FOR i IN 1 .. coalesce(array_length(b_hash, 1), 0) LOOP
        v_session := b_session[i];
        v_hash := b_hash[i];
        v_size := b_size[i];
        v_codec := b_codec[i];
        v_data := b_data[i];
        INSERT INTO blobs (session_id, hash, size, codec, data)
        VALUES (v_session, v_hash, v_size, v_codec, v_data)
        ON CONFLICT (session_id, hash) DO NOTHING;
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(n_id, 1), 0) LOOP
        v_session := n_session[i];
        v_id := n_id[i];
        v_parent := n_parent[i];
        v_func := n_function[i];
        v_kind := n_kind[i];
        v_now := n_created[i];
        v_hash := n_hash[i];
        v_body := n_body[i];
        v_body_z := n_body_z[i];
        INSERT INTO nodes (session_id, id, parent_id, function_id, kind, created_at_ms, hash,
                           body, body_z)
        VALUES (v_session, v_id, v_parent, v_func, v_kind, v_now, v_hash, v_body, v_body_z);
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(t_session, 1), 0) LOOP
        v_session := t_session[i];
        v_branch := t_branch[i];
        v_old := t_expected[i];
        v_new := t_head[i];
        v_now := t_now[i];
        UPDATE branches SET head_id = v_new, updated_at_ms = v_now
        WHERE session_id = v_session AND name = v_branch AND head_id IS NOT DISTINCT FROM v_old;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the head of branch % moved on', v_branch USING ERRCODE = 'CTXHM';
        END IF;
    END LOOP;
    RETURN 1;
END
$$;
