-- Every session belongs to one tenant (the API key's); '' is the tenant of a server without keys.
ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
-- ListSessions pages one tenant's sessions newest first.
CREATE INDEX sessions_tenant ON sessions (tenant, id);
