//! What an SQL engine supplies to the statements both engines run (`reads`, `writes`): a
//! connection that runs a statement with its values ([`Run`]), its own text of the statements
//! the two word differently, and the reads and writes whose form is its own ([`Sql`],
//! [`SqlWrite`]).
//!
//! Placeholders are numbered (`$1`, or `?1` in SQLite's own texts) and every engine binds the
//! same values in the same order: sqlx's SQLite binds a numbered placeholder by its number and
//! lets a text leave a value unused (one file holds every session, so many of SQLite's
//! statements need no session), where PostgreSQL takes exactly the values its text uses.

use async_trait::async_trait;

use super::Result;
use super::decode::Columns;
use super::writes::Tx;
use crate::domain::{
    BranchName, CompactionId, GatewayCallId, Hash, NodeId, SessionId, SummaryId, Tenant, Tombstone,
};
use crate::store::backend::{AppendTx, BranchStart, Deleted, StoredBlob};
use crate::store::form::rows::NodeRow;
use crate::store::session::compaction::CompactionPlan;

/// A value a statement binds. A NULL keeps its type: PostgreSQL types a parameter by what is
/// bound to it.
#[derive(Debug, Clone, Copy)]
pub(in crate::store) enum Arg<'a> {
    Bytes(Option<&'a [u8]>),
    Text(Option<&'a str>),
    Int(Option<i64>),
    /// Texts as one value: an array on PostgreSQL, a JSON array on SQLite (read with
    /// `json_each`).
    Texts(&'a [&'a str]),
}

impl Arg<'_> {
    /// A number, bound as a 64-bit integer.
    pub(in crate::store) fn int(n: impl Into<i64>) -> Self {
        Arg::Int(Some(n.into()))
    }
}

/// A value as a statement binds it.
pub(in crate::store) trait ToArg {
    /// A NULL of this value's type.
    const NULL: Arg<'static>;

    fn arg(&self) -> Arg<'_>;
}

/// Implements [`ToArg`] for each type, bound as `Arg::$variant` of what `$value` makes of it.
macro_rules! bind_as {
    ($variant:ident: $($ty:ty => |$it:ident| $value:expr),* $(,)?) => {$(
        impl ToArg for $ty {
            const NULL: Arg<'static> = Arg::$variant(None);

            fn arg(&self) -> Arg<'_> {
                let $it = self;
                Arg::$variant(Some($value))
            }
        }
    )*};
}

bind_as!(Bytes:
    SessionId => |id| id.as_bytes(),
    NodeId => |id| id.as_bytes(),
    CompactionId => |id| id.as_bytes(),
    SummaryId => |id| id.as_bytes(),
    GatewayCallId => |id| id.as_bytes(),
    Hash => |hash| &hash.0,
    [u8] => |bytes| bytes,
    Vec<u8> => |bytes| bytes,
);
bind_as!(Text:
    str => |text| text,
    String => |text| text,
    BranchName => |name| name.as_str(),
    Tenant => |tenant| tenant.as_str(),
);
bind_as!(Int: i64 => |n| *n);

impl<const N: usize> ToArg for [u8; N] {
    const NULL: Arg<'static> = Arg::Bytes(None);

    fn arg(&self) -> Arg<'_> {
        Arg::Bytes(Some(self))
    }
}

impl<T: ToArg> ToArg for Option<T> {
    const NULL: Arg<'static> = T::NULL;

    fn arg(&self) -> Arg<'_> {
        self.as_ref().map_or(T::NULL, ToArg::arg)
    }
}

impl<T: ToArg + ?Sized> ToArg for &T {
    const NULL: Arg<'static> = T::NULL;

    fn arg(&self) -> Arg<'_> {
        (**self).arg()
    }
}

/// A connection that runs statements: a reader's, a write's, or a committer's.
#[async_trait]
pub(in crate::store) trait Run: Send {
    type Row: Columns + Send + Sync;

    async fn fetch_all(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<Vec<Self::Row>>;

    /// Runs a statement that returns no rows; the rows it changed.
    async fn execute(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<u64>;

    /// The row of a statement that finds one at most (read as all it finds: one at most).
    async fn fetch_optional(
        &mut self,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> Result<Option<Self::Row>> {
        Ok(self.fetch_all(sql, args).await?.into_iter().next())
    }

    /// The row of a statement that always finds one.
    async fn fetch_one(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<Self::Row> {
        let row = self.fetch_optional(sql, args).await?;
        Ok(row.ok_or(sqlx::Error::RowNotFound)?)
    }

    /// Every row `sql` finds, as `decode` reads it.
    async fn rows_as<R: Send>(
        &mut self,
        sql: &'static str,
        args: &[Arg<'_>],
        decode: for<'r> fn(&'r Self::Row) -> Result<R>,
    ) -> Result<Vec<R>> {
        self.fetch_all(sql, args)
            .await?
            .iter()
            .map(decode)
            .collect()
    }
}

/// Implements [`Run`] for an engine's connection `$conn<C: $connection>` (whose `conn()` is
/// sqlx's connection of database `$db`, and whose rows are `$row`), binding a list of texts
/// as `$texts` makes it of `$list`; and defines `push_row`, which binds values into a row of a
/// multi-row VALUES list. A macro rather than generic code: sqlx binds a value of a type its
/// database encodes, which generic code could only ask for with a bound per type.
macro_rules! run_on_sqlx {
    ($conn:ident, $connection:ident, $db:ty, $row:ty, |$list:ident| $texts:expr) => {
        /// `sql` with `args` bound in order.
        fn bound(
            sql: &'static str,
            args: &[$crate::store::sql::Arg<'_>],
        ) -> sqlx::query::Query<'static, $db, <$db as sqlx::Database>::Arguments> {
            use $crate::store::sql::Arg;
            args.iter().fold(sqlx::query(sql), |query, arg| match *arg {
                Arg::Bytes(bytes) => query.bind(bytes),
                Arg::Text(text) => query.bind(text),
                Arg::Int(int) => query.bind(int),
                Arg::Texts($list) => query.bind($texts),
            })
        }

        /// Binds `args`, in order, as a row of a multi-row VALUES list.
        fn push_row(
            mut row: sqlx::query_builder::Separated<'_, $db, &'static str>,
            args: &[$crate::store::sql::Arg<'_>],
        ) {
            use $crate::store::sql::Arg;
            for arg in args {
                match *arg {
                    Arg::Bytes(bytes) => row.push_bind(bytes),
                    Arg::Text(text) => row.push_bind(text),
                    Arg::Int(int) => row.push_bind(int),
                    Arg::Texts($list) => row.push_bind($texts),
                };
            }
        }

        #[async_trait::async_trait]
        impl<C: $connection> $crate::store::sql::Run for $conn<C> {
            type Row = $row;

            async fn fetch_all(
                &mut self,
                sql: &'static str,
                args: &[$crate::store::sql::Arg<'_>],
            ) -> $crate::store::Result<Vec<$row>> {
                Ok(bound(sql, args).fetch_all(self.conn()).await?)
            }

            async fn execute(
                &mut self,
                sql: &'static str,
                args: &[$crate::store::sql::Arg<'_>],
            ) -> $crate::store::Result<u64> {
                Ok(bound(sql, args).execute(self.conn()).await?.rows_affected())
            }
        }
    };
}
pub(in crate::store) use run_on_sqlx;

/// An engine's connection as the reads both engines run use it: the texts it words its own way
/// and the reads whose statements are its own.
#[async_trait]
pub(in crate::store) trait Sql: Run {
    /// `tenant, after, limit, low, high, metadata`: a tenant's sessions, newest first.
    const SESSIONS: &'static str;
    /// `session`: its branches by name, each head with its hash.
    const BRANCHES: &'static str;
    /// `session, id`.
    const PARENT_OF: &'static str;
    /// `session, head`: the ids of the path, root first.
    const PATH_TO: &'static str;
    /// `session, start, limit`: node rows, oldest first.
    const ANCESTORS: &'static str;
    /// `session, head, function`: node rows, oldest first.
    const CHAIN: &'static str;
    /// `id`: `session_id, tenant`.
    const COMPACTION_OWNER: &'static str;
    /// `session, branch`: events, oldest first.
    const EVENTS: &'static str;
    /// `before_ms, limit, only, except`.
    const IDLE_SESSIONS: &'static str;
    /// `session`: the sums [`super::decode::gateway_usage`] reads.
    const GATEWAY_USAGE: &'static str;

    /// Whether the rows a decision reads are locked until the transaction ends (PostgreSQL in
    /// a write or the committer's batch; SQLite's write lock holds the whole file instead).
    fn locks(&self) -> bool;

    async fn branch_start(&mut self, session: SessionId, name: &BranchName) -> Result<BranchStart>;

    async fn nodes(&mut self, session: SessionId, ids: &[NodeId]) -> Result<Vec<NodeRow>>;

    async fn blobs(&mut self, session: SessionId, hashes: &[Hash]) -> Result<Vec<StoredBlob>>;

    async fn plan_tombstone(&mut self, id: CompactionId) -> Result<Option<Tombstone>>;
}

/// An engine's write transaction as the writes both engines run use it: the texts it words its
/// own way and the writes whose statements are its own.
#[async_trait]
pub(in crate::store) trait SqlWrite: Sql + AppendTx {
    type Db: sqlx::Database;
    /// What the engine keeps with the transaction until it ends.
    type Kept: Send;

    /// `id, tenant, now, metadata, creation_key`: the session's row.
    const INSERT_SESSION: &'static str;
    /// `state, session, plan`.
    const SET_PLAN_STATE: &'static str;
    /// `session, id, compaction_id, covers, text, model, base_head, tokens_before, tokens_after,
    /// created_at_ms, kind, rolls_over, range_from, range_to, ledger`.
    const INSERT_SUMMARY: &'static str;

    async fn insert_plan(&mut self, plan: &CompactionPlan) -> Result<()>;

    async fn lock_session(&mut self, session: SessionId) -> Result<Option<Tenant>>;

    /// Counts, then removes, every row of the session but its tombstone.
    async fn remove_session(&mut self, session: SessionId, tenant: &Tenant) -> Result<Removed>;

    async fn record_summarizer_source(&mut self, session: SessionId, source: &Hash)
    -> Result<bool>;

    fn into_tx(self: Box<Self>) -> Tx<Self::Db, Self::Kept>;
}

/// What a session's deletion removed, counted before.
pub(in crate::store) struct Removed {
    pub(super) nodes: i64,
    pub(super) branches: i64,
    pub(super) summaries: i64,
    blobs: i64,
    blob_bytes: i64,
}

impl Removed {
    /// The counts as read: `nodes`, `branches` and `summaries` of `rows`, `blobs` and
    /// `blob_bytes` of `blobs` (one row may hold all five).
    pub(in crate::store) fn counted(rows: &impl Columns, blobs: &impl Columns) -> Result<Self> {
        use super::decode::req_int;
        Ok(Self {
            nodes: req_int(rows, "nodes")?,
            branches: req_int(rows, "branches")?,
            summaries: req_int(rows, "summaries")?,
            blobs: req_int(blobs, "blobs")?,
            blob_bytes: req_int(blobs, "blob_bytes")?,
        })
    }

    /// The deletion's record: `tombstone` with these counts, and the blobs removed.
    pub(super) fn deleted(&self, mut tombstone: Tombstone) -> Deleted {
        tombstone.nodes = u64::try_from(self.nodes).unwrap_or(0);
        tombstone.branches = u32::try_from(self.branches).unwrap_or(u32::MAX);
        tombstone.summaries = u32::try_from(self.summaries).unwrap_or(u32::MAX);
        Deleted {
            tombstone,
            blobs: u64::try_from(self.blobs).unwrap_or(0),
            blob_bytes: u64::try_from(self.blob_bytes).unwrap_or(0),
        }
    }
}
