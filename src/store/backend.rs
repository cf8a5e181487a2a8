//! The seam between the store's rules and a database engine: what a backend implements (its
//! SQL, its connections, its transactions) and nothing else.
//!
//! Everything that decides (tenant scope, idempotency, the append checks and the committer's
//! memory, the compare-and-swap of a summary on the branch head, the branch and pin rules, the
//! read cache) is written once, in the store's other modules, against these traits. A backend
//! answers plain questions ("the head of this branch", "insert this row") and reports what is
//! missing as `None` or `false`; the not-found and already-exists errors are made here, once.
//!
//! The traits are object-safe (`async_trait`): the store holds `Arc<dyn Backend>` and the
//! engine is chosen when it opens, so no layer above the store is generic over it. A box per
//! call costs nanoseconds beside a statement's microseconds.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use async_trait::async_trait;

use super::append::idempotency::CreationKey;
use super::append::planned::BatchRows;
use super::append::request::AppendOutcome;
use super::form::rows::NodeRow;
use super::session::compaction::{CompactionPlan, PlanState};
use super::session::lifecycle::Tenants;
use super::{Error, Result};
use crate::domain::{
    self, Branch, BranchName, CompactionEvent, CompactionId, EventKind, Hash, NodeId, Reason,
    SessionFilter, SessionId, Summary, SummaryId, Tenant, Tombstone,
};

/// A database engine under the store.
#[async_trait]
pub(super) trait Backend: Send + Sync + 'static {
    /// A connection for reads, beside any writer.
    async fn read(&self) -> Result<Box<dyn Reads>>;

    /// A write transaction. Writes are serialisable with each other and with the group
    /// committer's batches: a transaction reads what it checks and writes in one unit.
    async fn begin_write(&self) -> Result<Box<dyn WriteTx>>;

    /// A write transaction for a session's deletion, which removes children and parents
    /// alike (SQLite's skips foreign-key checks, which would scan the nodes once per node).
    async fn begin_delete(&self) -> Result<Box<dyn WriteTx>> {
        self.begin_write().await
    }

    /// A failed write, said more precisely where the engine can (SQLite: an I/O error while
    /// the disk has no room is a full database).
    fn diagnose(&self, error: Error) -> Error;

    /// Sets the most bytes the database may take (`None`: no limit) and returns the limit in
    /// effect.
    async fn set_max_db_bytes(&self, bytes: Option<u64>) -> Result<u64>;

    /// Copies the database, consistent at one moment, to the new file `to`; returns its size.
    async fn backup(&self, to: &std::path::Path) -> Result<u64>;

    /// The database's size and its free space.
    async fn footprint(&self) -> Result<Footprint>;

    /// Gives the free space of deleted rows back to the operating system where the engine can
    /// do it without stopping writers (SQLite in incremental auto-vacuum mode; PostgreSQL's
    /// autovacuum does it by itself).
    async fn release_free_space(&self) -> Result<()>;

    /// Closes the connections (after the group committer stopped).
    async fn close(&self);
}

/// How big the database is, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    pub bytes: u64,
    /// Pages of deleted rows that later writes reuse (SQLite's free list; 0 on PostgreSQL,
    /// which does not say cheaply).
    pub free_bytes: u64,
}

/// The one-row lookups every transaction makes: the reader's, a write's and the committer's.
/// Implementations answer `find_*`; the provided methods make the errors.
#[async_trait]
pub(super) trait Lookups: Send {
    async fn session_exists(&mut self, session: SessionId) -> Result<bool>;

    /// `None`: no such branch; `Some(None)`: a branch with no head.
    async fn find_branch_head(
        &mut self,
        session: SessionId,
        name: &BranchName,
    ) -> Result<Option<Option<NodeId>>>;

    /// A function's chain head and whether a result closed it; `None`: no such function.
    async fn find_function(
        &mut self,
        session: SessionId,
        function: NodeId,
    ) -> Result<Option<(Option<NodeId>, bool)>>;

    async fn find_node(&mut self, session: SessionId, id: NodeId) -> Result<Option<NodeRow>>;

    /// The stored record of an append's idempotency key: the request's fingerprint and the
    /// first answer.
    async fn idempotency_record(
        &mut self,
        session: SessionId,
        key: &str,
    ) -> Result<Option<(Hash, AppendOutcome)>>;

    async fn ensure_session(&mut self, session: SessionId) -> Result<()> {
        if self.session_exists(session).await? {
            Ok(())
        } else {
            Err(domain::Error::not_found("session", session).into())
        }
    }

    async fn branch_head(
        &mut self,
        session: SessionId,
        name: &BranchName,
    ) -> Result<Option<NodeId>> {
        self.find_branch_head(session, name)
            .await?
            .ok_or_else(|| domain::Error::not_found("branch", name).into())
    }

    /// A function's chain head and whether it is closed.
    async fn function_row(
        &mut self,
        session: SessionId,
        function: NodeId,
    ) -> Result<(Option<NodeId>, bool)> {
        self.find_function(session, function)
            .await?
            .ok_or_else(|| domain::Error::not_found("function", function).into())
    }

    /// One node of `session`; `field` names the request field in the not-found error.
    async fn node_row(&mut self, session: SessionId, id: NodeId, field: &str) -> Result<NodeRow> {
        self.find_node(session, id).await?.ok_or_else(|| {
            domain::Error::NotFound {
                what: "node",
                id: format!("{id} ({field})"),
            }
            .into()
        })
    }
}

/// Reads.
#[async_trait]
pub(super) trait Reads: Lookups {
    async fn session_tenant(&mut self, id: SessionId) -> Result<Option<Tenant>>;

    /// The session a creation key made, and the fingerprint of the request that made it.
    async fn session_key(
        &mut self,
        tenant: &Tenant,
        key: &str,
    ) -> Result<Option<(Hash, SessionId)>>;

    async fn session(&mut self, id: SessionId) -> Result<Option<SessionRow>>;

    /// A page of a tenant's sessions (see [`SessionPage`]).
    async fn sessions(&mut self, page: &SessionPage<'_>) -> Result<Vec<SessionRow>>;

    /// Nodes stored for a session, its functions' internal chains included.
    async fn node_count(&mut self, session: SessionId) -> Result<u64>;

    /// A session's branches by name, each head with its hash.
    async fn branches(&mut self, session: SessionId) -> Result<Vec<Branch>>;

    /// Pin events of a session, oldest first: (node, pinned).
    async fn pin_events(&mut self, session: SessionId) -> Result<Vec<(NodeId, bool)>>;

    /// Every summary of a session, oldest first.
    async fn summaries(&mut self, session: SessionId) -> Result<Vec<Summary>>;

    /// A render's common start, in as few round trips as the engine allows.
    async fn branch_start(&mut self, session: SessionId, name: &BranchName) -> Result<BranchStart>;

    // Reads of a session's nodes and blobs name the session even where the ids alone would
    // do: an engine that spreads sessions over machines routes every statement by it.

    async fn parent_of(&mut self, session: SessionId, id: NodeId) -> Result<Option<NodeId>>;

    /// The ids of the path ending at `head`, root first.
    async fn path_to(&mut self, session: SessionId, head: NodeId) -> Result<Vec<NodeId>>;

    /// `start` and its ancestors, oldest first, at most `limit` of them counted from `start`.
    async fn ancestors(
        &mut self,
        session: SessionId,
        start: NodeId,
        limit: Option<u32>,
    ) -> Result<Vec<NodeRow>>;

    /// The internal chain of `function` ending at `head`, oldest first.
    async fn chain(
        &mut self,
        session: SessionId,
        head: NodeId,
        function: NodeId,
    ) -> Result<Vec<NodeRow>>;

    /// The nodes of `ids` that exist, in any order.
    async fn nodes(&mut self, session: SessionId, ids: &[NodeId]) -> Result<Vec<NodeRow>>;

    /// The blobs of `hashes` that exist, as stored.
    async fn blobs(&mut self, session: SessionId, hashes: &[Hash]) -> Result<Vec<StoredBlob>>;

    /// The session and tenant of compaction `id`.
    async fn compaction_owner(&mut self, id: CompactionId) -> Result<Option<(SessionId, Tenant)>>;

    async fn find_plan(
        &mut self,
        session: SessionId,
        id: CompactionId,
    ) -> Result<Option<CompactionPlan>>;

    /// The audit trail of a session (one branch's, if given), oldest first.
    async fn events(
        &mut self,
        session: SessionId,
        branch: Option<&BranchName>,
    ) -> Result<Vec<CompactionEvent>>;

    /// The latest `limit` commit attempts (committed or rejected) on `branch`, newest first:
    /// their reason and the head their plan was based at.
    async fn recent_commits(
        &mut self,
        session: SessionId,
        branch: &BranchName,
        limit: u32,
    ) -> Result<Vec<(Option<Reason>, Option<NodeId>)>>;

    async fn summarizer_output(&mut self, source: &Hash) -> Result<Option<String>>;

    async fn tombstone(&mut self, session: SessionId) -> Result<Option<Tombstone>>;

    /// The tombstone of the session a plan belonged to when a deletion found it open.
    async fn plan_tombstone(&mut self, id: CompactionId) -> Result<Option<Tombstone>>;

    /// Sessions of `tenants` with no branch moved since `before_ms` (and created before it),
    /// oldest first.
    async fn idle_sessions(
        &mut self,
        before_ms: i64,
        limit: u32,
        tenants: Tenants<'_>,
    ) -> Result<Vec<SessionId>>;

    /// Live sessions and tombstones.
    async fn session_counts(&mut self) -> Result<(u64, u64)>;

    /// The node of `session` whose hash is `hash` (the gateway finds a resent history's stored
    /// prefix by it; a hash covers the enclosing function's, so it names one chain's node).
    async fn node_by_hash(&mut self, session: SessionId, hash: &Hash) -> Result<Option<NodeId>>;

    /// Up to `limit` nodes of `session` whose hash lies in `hashes` (a reference's prefix,
    /// padded with zeros and with ones), in hash order.
    async fn nodes_by_hash_range(
        &mut self,
        session: SessionId,
        hashes: RangeInclusive<Hash>,
        limit: u32,
    ) -> Result<Vec<NodeId>>;

    /// The gateway's calls of `session`, added up.
    async fn gateway_usage(&mut self, session: SessionId) -> Result<domain::GatewayUsage>;

    /// Up to `limit` of the gateway's calls of `session` recorded after call `after` (from the
    /// first without it), in the order they were recorded, each with its id.
    async fn gateway_calls(
        &mut self,
        session: SessionId,
        after: Option<domain::GatewayCallId>,
        limit: u32,
    ) -> Result<Vec<(domain::GatewayCallId, domain::GatewayCall)>>;

    /// What the gateway left for the next call of `session`'s conversation `scope` (empty: the
    /// session's own; a function's id: a sub-agent's), as the gateway wrote it.
    async fn gateway_conversation(
        &mut self,
        session: SessionId,
        scope: &[u8],
    ) -> Result<Option<String>>;

    async fn plan(&mut self, session: SessionId, id: CompactionId) -> Result<CompactionPlan> {
        self.find_plan(session, id)
            .await?
            .ok_or_else(|| domain::Error::not_found("compaction", id).into())
    }
}

/// A transaction that writes an append's checked rows: the committer's, or a write's (an
/// import's runs of nodes).
#[async_trait]
pub(super) trait AppendTx: Lookups {
    async fn write_rows(&mut self, rows: &BatchRows) -> Result<()>;
}

/// A write transaction. Dropped without [`WriteTx::commit`], it rolls back.
#[async_trait]
pub(super) trait WriteTx: Reads + AppendTx {
    /// A session row (remembering the creation key it is made with, if any) and its empty
    /// `main` branch.
    async fn insert_session(&mut self, session: &NewSession<'_>) -> Result<()>;

    /// Records `key` as the one that made `session`; `false`: the tenant used the key already
    /// (a concurrent creation won), nothing was written.
    async fn insert_session_key(
        &mut self,
        session: &NewSession<'_>,
        key: &CreationKey,
    ) -> Result<bool>;

    /// Records one call the gateway forwarded for `session`.
    async fn insert_gateway_call(
        &mut self,
        session: SessionId,
        call: &domain::GatewayCall,
    ) -> Result<()>;

    /// Replaces what the gateway keeps for the next call of a session's conversation.
    async fn save_gateway_conversation(&mut self, saved: &SavedConversation<'_>) -> Result<()>;

    /// A new branch; `false`: a branch of that name exists, nothing was written.
    async fn insert_branch(&mut self, branch: &BranchAt<'_>) -> Result<bool>;

    /// Points a branch (which exists) at its new head.
    async fn set_branch_head(&mut self, branch: &BranchAt<'_>) -> Result<()>;

    /// `false`: no such branch.
    async fn delete_branch(&mut self, session: SessionId, name: &BranchName) -> Result<bool>;

    /// One pin event (node, pinned), as [`Reads::pin_events`] reads it back.
    async fn insert_pin(&mut self, session: SessionId, pin: (NodeId, bool), now: i64)
    -> Result<()>;

    async fn insert_plan(&mut self, plan: &CompactionPlan) -> Result<()>;

    async fn set_plan_state(
        &mut self,
        session: SessionId,
        id: CompactionId,
        state: PlanState,
    ) -> Result<()>;

    async fn insert_summary(&mut self, session: SessionId, summary: &Summary) -> Result<()>;

    /// One more summary in the session's compaction count.
    async fn count_compaction(&mut self, session: SessionId) -> Result<()>;

    async fn insert_event(&mut self, event: &NewEvent<'_>) -> Result<()>;

    /// The tenant of `session`, locked against concurrent writes to it until the transaction
    /// ends; `None` for an unknown session.
    async fn lock_session(&mut self, session: SessionId) -> Result<Option<Tenant>>;

    /// Removes every row of `session` (nodes, branches, functions, summaries, plans, events,
    /// pins, idempotency records and creation keys, and the blobs no other session refers to),
    /// records `tombstone` (its counts filled from what was removed) and the plans it found
    /// open, and returns the tombstone as recorded.
    async fn delete_session(&mut self, tombstone: Tombstone) -> Result<Deleted>;

    /// Keeps (or replaces) the summarizer's output for a source.
    async fn save_summarizer_output(&mut self, source: &Hash, text: &str, now: i64) -> Result<()>;

    /// Records that `session` used the summarizer's output for `source`, where a deletion
    /// finds it by session (PostgreSQL: the outputs are distributed by source, so a deletion
    /// names each by its key); `false` when the engine keeps no such record (SQLite finds a
    /// session's outputs by their text).
    async fn record_summarizer_source(&mut self, session: SessionId, source: &Hash)
    -> Result<bool>;

    async fn commit(self: Box<Self>) -> Result<()>;

    async fn rollback(self: Box<Self>) -> Result<()>;
}

/// The group committer's own transaction on its own connection: begun, checked and written
/// (`AppendTx`), committed, again and again.
#[async_trait]
pub(super) trait CommitterConnection: AppendTx {
    /// Whether the database is distributed, so a batch is split by shard ([`Self::shards`]).
    fn sharded(&self) -> bool {
        false
    }

    /// Where each of `sessions` lives, in order (asked only when [`Self::sharded`]): the node
    /// whose sessions may share a call written at once, and the shard whose sessions may share
    /// a transaction.
    async fn shards(&mut self, sessions: &[SessionId]) -> Result<Vec<(i64, i64)>> {
        Ok(vec![(0, 0); sessions.len()])
    }

    /// Whether [`Self::write_at_once`] may write a batch.
    fn writes_at_once(&self) -> bool {
        false
    }

    /// Writes `rows` (a batch planned from remembered state, with no read) outside a
    /// transaction in one statement that moves each of `targets` (session, branch, the head
    /// expected; in the batch's lock order) only if every head is still the expected one, and
    /// commits it: `Some(true)` written, `Some(false)` a head had moved and nothing was
    /// written, `None` rows of a kind this cannot write, nothing done.
    async fn write_at_once(
        &mut self,
        _rows: &BatchRows,
        _targets: &[(SessionId, BranchName, Option<NodeId>)],
    ) -> Result<Option<bool>> {
        Ok(None)
    }

    /// Whether another connection (or process) has committed since this was last asked, told
    /// without reading the database (no transaction is open); `None`: it cannot be told so,
    /// and what was read before may be stale.
    fn others_committed(&mut self) -> Option<bool> {
        None
    }

    async fn begin(&mut self) -> Result<()>;
    async fn commit(&mut self) -> Result<()>;
    /// Undoes what the open transaction wrote, if the engine has not done so already.
    async fn rollback(&mut self);
    async fn close(self: Box<Self>);
}

/// A session as stored, without its branches.
pub(super) struct SessionRow {
    pub(super) id: SessionId,
    pub(super) created_at_ms: i64,
    pub(super) metadata: BTreeMap<String, String>,
    pub(super) compaction_count: u32,
}

/// A content blob as stored (`codec`: how `data` is packed; `size`: its bytes unpacked).
pub(super) struct StoredBlob {
    pub(super) hash: Hash,
    pub(super) size: i64,
    pub(super) codec: i64,
    pub(super) data: Vec<u8>,
}

/// What a render of a branch starts from.
pub(super) enum BranchStart {
    NoSession,
    NoBranch,
    /// The branch has no head yet.
    Empty,
    At {
        head: NodeId,
        summaries: Vec<Summary>,
        pin_events: Vec<(NodeId, bool)>,
    },
}

/// A session to create: its row, and the creation key it is made with, if any.
pub(super) struct NewSession<'a> {
    pub(super) id: SessionId,
    pub(super) tenant: &'a Tenant,
    pub(super) now: i64,
    pub(super) metadata: &'a BTreeMap<String, String>,
    pub(super) key: Option<&'a CreationKey>,
}

/// A page of a tenant's sessions that `filter` lets through, newest first, strictly older than
/// `after`; at most `limit`.
pub(super) struct SessionPage<'a> {
    pub(super) tenant: &'a Tenant,
    pub(super) after: Option<SessionId>,
    pub(super) limit: u32,
    pub(super) filter: &'a SessionFilter,
}

/// A branch of `session` named `name` with head `head`, as written at `now`.
pub(super) struct BranchAt<'a> {
    pub(super) session: SessionId,
    pub(super) name: &'a BranchName,
    pub(super) head: Option<NodeId>,
    pub(super) now: i64,
}

/// What the gateway left for the next call of `session`'s conversation `scope` (empty: the
/// session's own; a function's id: a sub-agent's), saved at `now`.
pub(super) struct SavedConversation<'a> {
    pub(super) session: SessionId,
    pub(super) scope: &'a [u8],
    pub(super) state: &'a str,
    pub(super) now: i64,
}

/// An event of a plan's audit trail, to record.
pub(super) struct NewEvent<'a> {
    pub(super) plan: &'a CompactionPlan,
    pub(super) kind: EventKind,
    pub(super) reason: Option<Reason>,
    pub(super) tokens_before: u32,
    pub(super) tokens_after: u32,
    pub(super) summary: Option<SummaryId>,
    pub(super) message: &'a str,
    pub(super) at: i64,
}

/// What a deletion removed.
#[derive(Debug, Clone)]
pub(super) struct Deleted {
    pub(super) tombstone: Tombstone,
    pub(super) blobs: u64,
    pub(super) blob_bytes: u64,
}

/// [`Tenants`] as a query binds it: the one tenant taken, or the tenants left out.
pub(super) fn tenant_filter(tenants: Tenants<'_>) -> (Option<&str>, Vec<&str>) {
    match tenants {
        Tenants::Only(tenant) => (Some(tenant.as_str()), Vec::new()),
        Tenants::Except(tenants) => (None, tenants.iter().map(|t| t.as_str()).collect()),
    }
}

/// The metadata pairs of `filter` as a query binds them: a JSON object, or NULL for none.
pub(super) fn metadata_filter(filter: &SessionFilter) -> Option<String> {
    (!filter.metadata.is_empty())
        .then(|| serde_json::to_string(&filter.metadata).expect("a map of strings serializes"))
}
