-- Summaries v2: the evidence ledger kept with each summary (JSON), segment summaries (a kind and
-- the range a caller chose), every summary a new one rolls over (packed ids, 16 bytes each),
-- and pins recorded as events (nodes stay immutable).

ALTER TABLE compactions ADD COLUMN kind TEXT NOT NULL DEFAULT 'rolling';
ALTER TABLE compactions ADD COLUMN rolls_over BLOB;
ALTER TABLE compactions ADD COLUMN range_from_id BLOB;
ALTER TABLE compactions ADD COLUMN range_to_id BLOB;
ALTER TABLE compactions ADD COLUMN ledger TEXT;

ALTER TABLE summaries ADD COLUMN kind TEXT NOT NULL DEFAULT 'rolling';
ALTER TABLE summaries ADD COLUMN rolls_over BLOB;
ALTER TABLE summaries ADD COLUMN range_from_id BLOB;
ALTER TABLE summaries ADD COLUMN range_to_id BLOB;
ALTER TABLE summaries ADD COLUMN ledger TEXT;

-- Summaries made before: the prior they rolled over is the one they roll over.
UPDATE summaries SET rolls_over = prior_id WHERE prior_id IS NOT NULL;
UPDATE compactions SET rolls_over = prior_summary_id WHERE prior_summary_id IS NOT NULL;

-- Pin and unpin events, in order; a node is pinned when its latest event says so.
CREATE TABLE pins (
    seq           INTEGER PRIMARY KEY,
    session_id    BLOB NOT NULL REFERENCES sessions (id),
    node_id       BLOB NOT NULL REFERENCES nodes (id),
    pinned        INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE INDEX pins_session ON pins (session_id, seq);
