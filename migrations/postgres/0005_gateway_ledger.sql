-- The gateway's ledger per call: how many tokens of the forwarded request were identical to the
-- previous forwarded request up to its last cache breakpoint (what the provider could read from
-- its cache), and why the prefix changed when it did (`step:20`, `budget`, `marker_moved`,
-- `client_changed`, `expired:360000`, `first`; NULL when it did not). Calls recorded before
-- these columns existed kept nothing that was measured: 0 and NULL. (On Citus, ALTER TABLE on
-- a distributed table is applied to every shard.)
ALTER TABLE gateway_calls ADD COLUMN kept_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE gateway_calls ADD COLUMN change TEXT;
