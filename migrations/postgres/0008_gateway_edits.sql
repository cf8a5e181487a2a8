-- The gateway's ledger per call, for models that bind their thinking to its prefix: the model
-- table's entry that priced the call, the edit ctxd asked the provider to make (tool uses to
-- clear and to keep; NULL without one), what the provider reports it cleared (tool uses and
-- input tokens; NULL when it reported no edit), the thinking blocks the provider dropped, and
-- those ctxd left out itself (the reasoning-dropping policy). Calls recorded before these
-- columns existed asked for nothing: NULL and 0. (On Citus, ALTER TABLE on a distributed table
-- is applied to every shard.)
ALTER TABLE gateway_calls ADD COLUMN priced_by TEXT;
ALTER TABLE gateway_calls ADD COLUMN edit_clear BIGINT;
ALTER TABLE gateway_calls ADD COLUMN edit_keep BIGINT;
ALTER TABLE gateway_calls ADD COLUMN provider_cleared BIGINT;
ALTER TABLE gateway_calls ADD COLUMN provider_cleared_tokens BIGINT;
ALTER TABLE gateway_calls ADD COLUMN provider_thinking_dropped BIGINT NOT NULL DEFAULT 0;
ALTER TABLE gateway_calls ADD COLUMN thinking_dropped BIGINT NOT NULL DEFAULT 0;
