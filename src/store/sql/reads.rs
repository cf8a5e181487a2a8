//! The store's reads (`Lookups`, `Reads`) on either SQL engine: each statement written once where
//! the engines word it alike, else in the engine's words ([`Sql`]'s texts), bound and decoded
//! the same way; the few reads whose statements are an engine's own are its ([`Sql`]).

use std::ops::RangeInclusive;

use async_trait::async_trait;

use super::decode::{self, gateway_call_columns, node_columns, summary_columns, tombstone_columns};
use super::engine::{Sql, ToArg};
use super::{Arg, Result};
use crate::domain::{
    Branch, BranchName, CompactionEvent, CompactionId, GatewayCall, GatewayCallId, GatewayUsage,
    Hash, NodeId, Reason, SessionId, Summary, Tenant, Tombstone,
};
use crate::store::append::request::AppendOutcome;
use crate::store::backend::{
    BranchStart, Lookups, Reads, SessionPage, SessionRow, StoredBlob, metadata_filter,
    tenant_filter,
};
use crate::store::form::rows::NodeRow;
use crate::store::session::compaction::CompactionPlan;
use crate::store::session::lifecycle::Tenants;

/// A statement, and the same locking the row it reads until the transaction ends: the one an
/// engine that [`Sql::locks`] runs when a decision rests on the row.
type Lockable = (&'static str, &'static str);

macro_rules! lockable {
    ($sql:literal) => {
        ($sql, concat!($sql, " FOR UPDATE"))
    };
}

/// The one row a lookup finds, if any.
fn first<R>(rows: Result<Vec<R>>) -> Result<Option<R>> {
    rows.map(|rows| rows.into_iter().next())
}

fn locked(conn: &impl Sql, (plain, locked): Lockable) -> &'static str {
    if conn.locks() { locked } else { plain }
}

// The one-row lookups, also run by SQLite's committer: each names `$1` before `$2`, so a
// driver that binds by position binds them alike.

/// A write that checks its session locks it against nothing but a delete: a shared lock.
pub(in crate::store) const SESSION_EXISTS: Lockable = (
    "SELECT 1 FROM sessions WHERE id = $1",
    "SELECT 1 FROM sessions WHERE id = $1 FOR SHARE",
);
pub(in crate::store) const BRANCH_HEAD: Lockable =
    lockable!("SELECT head_id FROM branches WHERE session_id = $1 AND name = $2");
pub(in crate::store) const FUNCTION_ROW: Lockable =
    lockable!("SELECT head_id, closed_by FROM functions WHERE session_id = $1 AND id = $2");
pub(in crate::store) const NODE_ROW: &str = concat!(
    "SELECT ",
    node_columns!(),
    " FROM nodes n WHERE n.session_id = $1 AND n.id = $2"
);
pub(in crate::store) const IDEMPOTENCY_RECORD: &str =
    "SELECT request_hash, response FROM idempotency WHERE session_id = $1 AND key = $2";

/// A write that commits or closes a plan locks it: two replicas committing one plan take
/// turns, and the second sees it applied.
const FIND_PLAN: Lockable = lockable!(
    "SELECT session_id, branch, base_head_id, kind, rolls_over, covers, range_from_id,
            range_to_id, ledger, budget, tokenizer, max_tool_result_chars, retain_turns,
            instructions, tokens_before, state, created_at_ms
     FROM compactions WHERE session_id = $1 AND id = $2"
);

const SESSION_TENANT: &str = "SELECT tenant FROM sessions WHERE id = $1";
const SESSION_KEY: &str =
    "SELECT request_hash, session_id FROM session_keys WHERE tenant = $1 AND key = $2";
const SESSION: &str =
    "SELECT id, created_at_ms, metadata, compaction_count FROM sessions WHERE id = $1";
const NODE_COUNT: &str = "SELECT COUNT(*) AS nodes FROM nodes WHERE session_id = $1";
const PIN_EVENTS: &str = "SELECT node_id, pinned FROM pins WHERE session_id = $1 ORDER BY seq";
const SUMMARIES: &str = concat!(
    "SELECT ",
    summary_columns!(),
    " FROM summaries WHERE session_id = $1 ORDER BY created_at_ms, id"
);
const RECENT_COMMITS: &str = "SELECT reason, base_head_id FROM compaction_events
     WHERE session_id = $1 AND branch = $2 AND kind IN ('committed', 'rejected')
     ORDER BY id DESC LIMIT $3";
const SUMMARIZER_OUTPUT: &str = "SELECT text FROM summarizer_outputs WHERE source_key = $1";
const TOMBSTONE: &str = concat!(
    "SELECT ",
    tombstone_columns!(),
    " FROM tombstones t WHERE t.session_id = $1"
);
const SESSION_COUNTS: &str = "SELECT (SELECT count(*) FROM sessions) AS sessions,
     (SELECT count(*) FROM tombstones) AS tombstones";
const NODE_BY_HASH: &str = "SELECT id FROM nodes WHERE session_id = $1 AND hash = $2 LIMIT 1";
const NODES_BY_HASH_RANGE: &str = "SELECT id FROM nodes
     WHERE session_id = $1 AND hash >= $2 AND hash <= $3 ORDER BY hash LIMIT $4";
const GATEWAY_CONVERSATION: &str =
    "SELECT state FROM gateway_conversations WHERE session_id = $1 AND scope = $2";

/// No cursor is the empty byte string, below every id, so one statement serves every page and
/// walks the primary key (session, id) from where the page starts.
const GATEWAY_CALLS: &str = concat!(
    "SELECT ",
    gateway_call_columns!(),
    " FROM gateway_calls WHERE session_id = $1 AND id > $2 ORDER BY id LIMIT $3"
);

#[async_trait]
impl<T: Sql> Lookups for T {
    async fn session_exists(&mut self, session: SessionId) -> Result<bool> {
        let sql = locked(self, SESSION_EXISTS);
        Ok(self.fetch_optional(sql, &[session.arg()]).await?.is_some())
    }

    async fn find_branch_head(
        &mut self,
        session: SessionId,
        name: &BranchName,
    ) -> Result<Option<Option<NodeId>>> {
        let sql = locked(self, BRANCH_HEAD);
        let row = self
            .fetch_optional(sql, &[session.arg(), name.arg()])
            .await?;
        row.map(|row| decode::node_id(&row, "head_id")).transpose()
    }

    async fn find_function(
        &mut self,
        session: SessionId,
        function: NodeId,
    ) -> Result<Option<(Option<NodeId>, bool)>> {
        let sql = locked(self, FUNCTION_ROW);
        let args = [session.arg(), function.arg()];
        first(self.rows_as(sql, &args, decode::function).await)
    }

    async fn find_node(&mut self, session: SessionId, id: NodeId) -> Result<Option<NodeRow>> {
        let args = [session.arg(), id.arg()];
        first(self.rows_as(NODE_ROW, &args, decode::node).await)
    }

    async fn idempotency_record(
        &mut self,
        session: SessionId,
        key: &str,
    ) -> Result<Option<(Hash, AppendOutcome)>> {
        let args = [session.arg(), key.arg()];
        first(
            self.rows_as(IDEMPOTENCY_RECORD, &args, decode::idempotency)
                .await,
        )
    }
}

#[async_trait]
impl<T: Sql> Reads for T {
    async fn session_tenant(&mut self, id: SessionId) -> Result<Option<Tenant>> {
        first(
            self.rows_as(SESSION_TENANT, &[id.arg()], decode::tenant)
                .await,
        )
    }

    async fn session_key(
        &mut self,
        tenant: &Tenant,
        key: &str,
    ) -> Result<Option<(Hash, SessionId)>> {
        let args = [tenant.arg(), key.arg()];
        first(self.rows_as(SESSION_KEY, &args, decode::session_key).await)
    }

    async fn session(&mut self, id: SessionId) -> Result<Option<SessionRow>> {
        first(self.rows_as(SESSION, &[id.arg()], decode::session).await)
    }

    async fn sessions(&mut self, page: &SessionPage<'_>) -> Result<Vec<SessionRow>> {
        let filter = page.filter;
        let (low, high) = filter.ids.map_or((None, None), |(l, h)| (Some(l), Some(h)));
        let metadata = metadata_filter(filter);
        let args = [
            page.tenant.arg(),
            page.after.arg(),
            Arg::int(page.limit),
            low.arg(),
            high.arg(),
            metadata.arg(),
        ];
        self.rows_as(T::SESSIONS, &args, decode::session).await
    }

    async fn node_count(&mut self, session: SessionId) -> Result<u64> {
        let row = self.fetch_one(NODE_COUNT, &[session.arg()]).await?;
        decode::count(&row, "nodes")
    }

    async fn branches(&mut self, session: SessionId) -> Result<Vec<Branch>> {
        self.rows_as(T::BRANCHES, &[session.arg()], decode::branch)
            .await
    }

    async fn pin_events(&mut self, session: SessionId) -> Result<Vec<(NodeId, bool)>> {
        self.rows_as(PIN_EVENTS, &[session.arg()], decode::pin)
            .await
    }

    async fn summaries(&mut self, session: SessionId) -> Result<Vec<Summary>> {
        self.rows_as(SUMMARIES, &[session.arg()], decode::summary)
            .await
    }

    async fn branch_start(&mut self, session: SessionId, name: &BranchName) -> Result<BranchStart> {
        Sql::branch_start(self, session, name).await
    }

    async fn parent_of(&mut self, session: SessionId, id: NodeId) -> Result<Option<NodeId>> {
        let row = self
            .fetch_one(T::PARENT_OF, &[session.arg(), id.arg()])
            .await?;
        decode::node_id(&row, "parent_id")
    }

    async fn path_to(&mut self, session: SessionId, head: NodeId) -> Result<Vec<NodeId>> {
        let args = [session.arg(), head.arg()];
        self.rows_as(T::PATH_TO, &args, decode::id).await
    }

    async fn ancestors(
        &mut self,
        session: SessionId,
        start: NodeId,
        limit: Option<u32>,
    ) -> Result<Vec<NodeRow>> {
        let limit = limit.map_or(i64::MAX, i64::from);
        let args = [session.arg(), start.arg(), limit.arg()];
        self.rows_as(T::ANCESTORS, &args, decode::node).await
    }

    async fn chain(
        &mut self,
        session: SessionId,
        head: NodeId,
        function: NodeId,
    ) -> Result<Vec<NodeRow>> {
        let args = [session.arg(), head.arg(), function.arg()];
        self.rows_as(T::CHAIN, &args, decode::node).await
    }

    async fn nodes(&mut self, session: SessionId, ids: &[NodeId]) -> Result<Vec<NodeRow>> {
        Sql::nodes(self, session, ids).await
    }

    async fn blobs(&mut self, session: SessionId, hashes: &[Hash]) -> Result<Vec<StoredBlob>> {
        Sql::blobs(self, session, hashes).await
    }

    async fn compaction_owner(&mut self, id: CompactionId) -> Result<Option<(SessionId, Tenant)>> {
        first(
            self.rows_as(T::COMPACTION_OWNER, &[id.arg()], decode::owner)
                .await,
        )
    }

    async fn find_plan(
        &mut self,
        session: SessionId,
        id: CompactionId,
    ) -> Result<Option<CompactionPlan>> {
        let sql = locked(self, FIND_PLAN);
        let row = self.fetch_optional(sql, &[session.arg(), id.arg()]).await?;
        row.map(|row| decode::plan(id, &row)).transpose()
    }

    async fn events(
        &mut self,
        session: SessionId,
        branch: Option<&BranchName>,
    ) -> Result<Vec<CompactionEvent>> {
        let args = [session.arg(), branch.arg()];
        self.rows_as(T::EVENTS, &args, decode::event).await
    }

    async fn recent_commits(
        &mut self,
        session: SessionId,
        branch: &BranchName,
        limit: u32,
    ) -> Result<Vec<(Option<Reason>, Option<NodeId>)>> {
        let args = [session.arg(), branch.arg(), Arg::int(limit)];
        self.rows_as(RECENT_COMMITS, &args, |row| {
            Ok((decode::reason(row)?, decode::node_id(row, "base_head_id")?))
        })
        .await
    }

    async fn summarizer_output(&mut self, source: &Hash) -> Result<Option<String>> {
        let row = self
            .fetch_optional(SUMMARIZER_OUTPUT, &[source.arg()])
            .await?;
        row.map(|row| decode::req_text(&row, "text")).transpose()
    }

    async fn tombstone(&mut self, session: SessionId) -> Result<Option<Tombstone>> {
        first(
            self.rows_as(TOMBSTONE, &[session.arg()], decode::tombstone)
                .await,
        )
    }

    async fn plan_tombstone(&mut self, id: CompactionId) -> Result<Option<Tombstone>> {
        Sql::plan_tombstone(self, id).await
    }

    async fn idle_sessions(
        &mut self,
        before_ms: i64,
        limit: u32,
        tenants: Tenants<'_>,
    ) -> Result<Vec<SessionId>> {
        let (only, except) = tenant_filter(tenants);
        let args = [
            before_ms.arg(),
            Arg::int(limit),
            only.arg(),
            Arg::Texts(&except),
        ];
        self.rows_as(T::IDLE_SESSIONS, &args, decode::session_id)
            .await
    }

    async fn session_counts(&mut self) -> Result<(u64, u64)> {
        let row = self.fetch_one(SESSION_COUNTS, &[]).await?;
        Ok((
            decode::count(&row, "sessions")?,
            decode::count(&row, "tombstones")?,
        ))
    }

    async fn node_by_hash(&mut self, session: SessionId, hash: &Hash) -> Result<Option<NodeId>> {
        let args = [session.arg(), hash.arg()];
        first(self.rows_as(NODE_BY_HASH, &args, decode::id).await)
    }

    async fn nodes_by_hash_range(
        &mut self,
        session: SessionId,
        hashes: RangeInclusive<Hash>,
        limit: u32,
    ) -> Result<Vec<NodeId>> {
        let (low, high) = hashes.into_inner();
        let args = [session.arg(), low.arg(), high.arg(), Arg::int(limit)];
        self.rows_as(NODES_BY_HASH_RANGE, &args, decode::id).await
    }

    async fn gateway_usage(&mut self, session: SessionId) -> Result<GatewayUsage> {
        let row = self.fetch_one(T::GATEWAY_USAGE, &[session.arg()]).await?;
        decode::gateway_usage(&row)
    }

    async fn gateway_calls(
        &mut self,
        session: SessionId,
        after: Option<GatewayCallId>,
        limit: u32,
    ) -> Result<Vec<(GatewayCallId, GatewayCall)>> {
        // No cursor binds the empty byte string (see `GATEWAY_CALLS`).
        let after = after.map_or_else(Vec::new, |id| id.as_bytes().to_vec());
        let args = [session.arg(), after.arg(), Arg::int(limit)];
        self.rows_as(GATEWAY_CALLS, &args, decode::gateway_call)
            .await
    }

    async fn gateway_conversation(
        &mut self,
        session: SessionId,
        scope: &[u8],
    ) -> Result<Option<String>> {
        let row = self
            .fetch_optional(GATEWAY_CONVERSATION, &[session.arg(), scope.arg()])
            .await?;
        row.map(|row| decode::req_text(&row, "state")).transpose()
    }
}
