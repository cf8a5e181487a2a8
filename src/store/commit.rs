//! The append write path: the group committer, the checks an append passes, and the multi-row
//! statements a batch of appends is written with.
//!
//! sqlx runs each SQLite connection on a worker thread, so every statement is a round trip to
//! it and a batch costs round trips, not rows. The committer therefore writes a batch in as few
//! as it can. It remembers each target's head, hashes and pairing state; when every target of
//! a batch is remembered, the whole batch is one round trip: `BEGIN IMMEDIATE`, a guard that
//! fails unless every remembered head is still the stored one, the writes (a few multi-row
//! statements) and `COMMIT`. Anything else that moves a head (another process, a deleted and
//! recreated branch) makes the guard fail before anything is written; the batch is then checked
//! again in the same transaction against what the database holds.

use std::collections::{HashMap, HashSet};

use sqlx::pool::PoolConnection;
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use super::body::{self, Body};
use super::fault::Fault;
use super::{
    AppendOutcome, AppendRequest, AppendTarget, CODEC_ZSTD, Error, Result, branch_head, compress,
    ensure_session, function_row, node_row, now_ms,
};
use crate::domain::{
    self, Admit, BranchName, ChainTail, ClosedChain, Hash, NodeContent, NodeId, SessionId,
    node_hash,
};

/// One append waiting for the group committer.
pub(super) struct Job {
    pub(super) request: AppendRequest,
    pub(super) reply: oneshot::Sender<Result<AppendOutcome>>,
}

/// Appends one transaction may carry.
pub(super) const MAX_BATCH: usize = 256;

type TargetKey = (SessionId, AppendTarget);

/// What the committer remembers of an append target: its head, the hashes new nodes chain
/// from, and its pairing state. All of it follows from the head, so it is used only while the
/// stored head is still `head`.
#[derive(Clone)]
struct TargetState {
    head: Option<NodeId>,
    head_hash: Option<Hash>,
    scope_hash: Option<Hash>,
    tail: ChainTail,
}

#[derive(Default)]
struct TargetCache(HashMap<TargetKey, TargetState>);

/// Targets remembered at most; past that the cache starts over.
const CACHE_TARGETS: usize = 100_000;

/// Hashes of blobs known to be stored. Blobs are never deleted, so a hash once stored stays
/// true; a blob not known here is written with `ON CONFLICT DO NOTHING` all the same.
#[derive(Default)]
struct KnownBlobs(HashSet<Hash>);

/// Blob hashes remembered at most (32 bytes each); past that the set starts over.
const KNOWN_BLOBS: usize = 200_000;

/// Rows a multi-row statement carries at most: 9 columns a node, well under SQLite's limit of
/// bound parameters per statement.
const ROWS_PER_STATEMENT: usize = 500;

/// Conditions a guard statement carries at most, well under SQLite's expression depth limit.
const CONDITIONS_PER_GUARD: usize = 64;

/// Batches up to this many appends keep their statements prepared: those shapes repeat.
const PREPARED_BATCH: usize = 4;

/// Takes appends off the queue and writes every one waiting in one transaction, then one
/// COMMIT (one fsync) for all.
pub(super) async fn group_committer(writer: SqlitePool, mut jobs: mpsc::Receiver<Job>) {
    let mut targets = TargetCache::default();
    let mut blobs = KnownBlobs::default();
    while let Some(first) = jobs.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let (mut requests, replies): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .map(|job| (job.request, job.reply))
            .unzip();
        // The connection goes back to the pool (which pings it on the way) only after the
        // answers are out.
        let mut conn = None;
        let written = match writer.acquire().await {
            Ok(c) => {
                let c = conn.insert(c);
                write_batch(c, &mut requests, &targets, &blobs).await
            }
            Err(e) => Err(e.into()),
        };
        match written {
            Ok(done) => {
                done.remember(&mut targets, &mut blobs);
                for (reply, outcome) in replies.into_iter().zip(done.outcomes) {
                    // The caller may have gone (cancelled); its append is durable all the
                    // same, and a retry with its idempotency key returns this answer.
                    let _ = reply.send(outcome);
                }
            }
            Err(e) => {
                // Kept with each answer: a full disk and a busy lock are told apart from a
                // defect. A rolled-back batch changed nothing the caches remember.
                let fault = e.fault().unwrap_or(Fault::Internal);
                let detail = e.to_string();
                tracing::error!(error = %detail, appends = replies.len(), "group commit failed");
                for reply in replies {
                    let _ = reply.send(Err(Error::Batch {
                        fault,
                        detail: detail.clone(),
                    }));
                }
            }
        }
        drop(conn);
    }
}

/// Checks and writes one batch, committed as a whole; each append's answer is its outcome or
/// the rule it broke (a refused append writes nothing, so the others stay whole). An error
/// means nothing of the batch was written.
async fn write_batch(
    conn: &mut PoolConnection<Sqlite>,
    requests: &mut [AppendRequest],
    targets: &TargetCache,
    blobs: &KnownBlobs,
) -> Result<Written> {
    let now = now_ms();
    // A retry must match the request as sent, before the checks fill in result names.
    let fingerprints: Vec<Option<Hash>> = requests
        .iter()
        .map(|r| {
            r.idempotency_key
                .as_ref()
                .map(|_| request_fingerprint(&r.target, r.expected_head, &r.nodes))
        })
        .collect();
    let unnamed = Unnamed::of(requests);
    // Whether this connection's transaction is open, and whether remembered states may be
    // trusted under a guard (not after a guard failed).
    let mut begun = false;
    let mut trust = Trust::Guard;
    for pass in 0.. {
        if pass > 0 {
            // Checked again from the start: as sent, not as the last pass filled them in.
            unnamed.restore(requests);
        }
        let mut batch = Batch::new(targets, blobs, trust, now);
        let mut outcomes = Vec::with_capacity(requests.len());
        let mut reads = begun.then_some(&mut **conn);
        let mut stopped = None;
        for (request, fingerprint) in requests.iter_mut().zip(&fingerprints) {
            match batch.append(&mut reads, request, *fingerprint).await {
                Ok(outcome) => outcomes.push(Ok(outcome)),
                Err(Stop::Error(Error::Domain(e))) => outcomes.push(Err(e.into())),
                Err(stop) => {
                    stopped = Some(stop);
                    break;
                }
            }
        }
        match stopped {
            None => {}
            // Something is not remembered: open the transaction and read it.
            Some(Stop::NeedsRead) if !begun => {
                if let Err(e) = sqlx::query("BEGIN IMMEDIATE").execute(&mut **conn).await {
                    roll_back(conn).await;
                    return Err(e.into());
                }
                begun = true;
                continue;
            }
            Some(Stop::NeedsRead) => {
                roll_back(conn).await;
                return Err(Error::Corrupt(
                    "a read was refused in an open transaction".into(),
                ));
            }
            Some(Stop::Error(e)) => {
                if begun {
                    roll_back(conn).await;
                }
                return Err(e);
            }
        }
        let mut sql = QueryBuilder::<Sqlite>::new("");
        if !begun {
            sql.push("BEGIN IMMEDIATE; ");
        }
        batch.push_guards(&mut sql);
        batch.pending.push_writes(&mut sql);
        sql.push("COMMIT");
        let result = sql
            .build()
            .persistent(requests.len() <= PREPARED_BATCH)
            .execute(&mut **conn)
            .await;
        match result {
            Ok(_) => {
                return Ok(Written {
                    outcomes,
                    seen: batch.seen,
                    closed: batch.closed,
                    blobs: batch.pending.blob_hashes,
                });
            }
            // A remembered head moved: nothing is written and the transaction is open; check
            // the batch again against the database.
            Err(e) if trust == Trust::Guard && is_guard_failure(&e) => {
                tracing::debug!("a remembered head moved; checking the batch again");
                begun = true;
                trust = Trust::Read;
            }
            Err(e) => {
                roll_back(conn).await;
                return Err(e.into());
            }
        }
    }
    unreachable!("a batch ends in a commit or an error")
}

/// The nodes whose name the checks fill in from their call (left empty by the client), and
/// the function results whose chain they record, so a batch checked again starts from the
/// request as sent.
struct Unnamed(Vec<(usize, usize)>);

impl Unnamed {
    fn of(requests: &[AppendRequest]) -> Self {
        let mut marks = Vec::new();
        for (r, request) in requests.iter().enumerate() {
            for (n, node) in request.nodes.iter().enumerate() {
                let filled = match node {
                    NodeContent::ToolResult { name, .. }
                    | NodeContent::FunctionCall { name, .. } => name.is_empty(),
                    NodeContent::FunctionResult(_) => true,
                    NodeContent::Message { .. } => false,
                };
                if filled {
                    marks.push((r, n));
                }
            }
        }
        Self(marks)
    }

    fn restore(&self, requests: &mut [AppendRequest]) {
        for &(r, n) in &self.0 {
            match &mut requests[r].nodes[n] {
                NodeContent::ToolResult { name, .. } | NodeContent::FunctionCall { name, .. } => {
                    name.clear();
                }
                NodeContent::FunctionResult(result) => result.chain = None,
                NodeContent::Message { .. } => {}
            }
        }
    }
}

/// Ends the transaction of a failed batch. A connection that cannot is closed rather than
/// handed back to the pool with a transaction open.
async fn roll_back(conn: &mut PoolConnection<Sqlite>) {
    if let Err(e) = sqlx::query("ROLLBACK").execute(&mut **conn).await {
        // The failure may have ended the transaction already (or it never began).
        if !e.to_string().contains("no transaction is active") {
            tracing::error!(error = %e, "rollback failed; closing the writer connection");
            conn.close_on_drop();
        }
    }
}

/// A batch written and committed.
struct Written {
    outcomes: Vec<Result<AppendOutcome>>,
    seen: HashMap<TargetKey, Seen>,
    closed: HashSet<(SessionId, NodeId)>,
    blobs: HashSet<Hash>,
}

impl Written {
    /// What the committed batch found and left is true until something else moves a head.
    fn remember(&self, targets: &mut TargetCache, blobs: &mut KnownBlobs) {
        if targets.0.len() + self.seen.len() > CACHE_TARGETS {
            targets.0.clear();
        }
        for (key, seen) in &self.seen {
            let closed = match key.1 {
                AppendTarget::Function(f) => seen.closed || self.closed.contains(&(key.0, f)),
                AppendTarget::Branch(_) => false,
            };
            if closed {
                // Nothing more goes into a closed function.
                targets.0.remove(key);
            } else {
                targets.0.insert(key.clone(), seen.state.clone());
            }
        }
        if blobs.0.len() + self.blobs.len() > KNOWN_BLOBS {
            blobs.0.clear();
        }
        blobs.0.extend(self.blobs.iter().copied());
    }
}

/// Why checking an append stopped short of an answer.
enum Stop {
    /// It needs a fact that is not remembered, and no transaction is open to read it in.
    NeedsRead,
    Error(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Error(e)
    }
}

impl From<domain::Error> for Stop {
    fn from(e: domain::Error) -> Self {
        Stop::Error(e.into())
    }
}

impl From<sqlx::Error> for Stop {
    fn from(e: sqlx::Error) -> Self {
        Stop::Error(e.into())
    }
}

type Step<T> = std::result::Result<T, Stop>;

/// How a batch learns the stored state of a target it remembers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trust {
    /// Take the remembered state and guard it in the write.
    Guard,
    /// Read the head and use the remembered state only if it is still that head.
    Read,
}

/// A target as this batch found or left it.
#[derive(Clone)]
struct Seen {
    state: TargetState,
    /// A function target closed when it was read (never for a remembered one: the guard
    /// requires it open).
    closed: bool,
}

/// One batch being checked: the targets as it found and left them, the facts its checks took
/// on trust, and the rows it will write. Also what an import writes its runs with.
pub(super) struct Batch<'c> {
    targets: &'c TargetCache,
    blobs: &'c KnownBlobs,
    trust: Trust,
    now: i64,
    seen: HashMap<TargetKey, Seen>,
    /// Remembered heads taken on trust, checked by the guard.
    guarded: Vec<(TargetKey, Option<NodeId>)>,
    /// Idempotency keys taken to be unused, checked by the guard.
    unused_keys: Vec<(SessionId, String)>,
    /// Idempotency records this batch writes.
    keys: HashMap<(SessionId, String), (Hash, AppendOutcome)>,
    /// Functions this batch closes.
    closed: HashSet<(SessionId, NodeId)>,
    pending: Pending,
}

static NO_TARGETS: std::sync::LazyLock<TargetCache> = std::sync::LazyLock::new(Default::default);
static NO_BLOBS: std::sync::LazyLock<KnownBlobs> = std::sync::LazyLock::new(Default::default);

impl<'c> Batch<'c> {
    fn new(targets: &'c TargetCache, blobs: &'c KnownBlobs, trust: Trust, now: i64) -> Self {
        Self {
            targets,
            blobs,
            trust,
            now,
            seen: HashMap::new(),
            guarded: Vec::new(),
            unused_keys: Vec::new(),
            keys: HashMap::new(),
            closed: HashSet::new(),
            pending: Pending::default(),
        }
    }

    /// A batch that remembers nothing and reads everything, inside the caller's transaction.
    pub(super) fn standalone(now: i64) -> Batch<'static> {
        Batch::new(&NO_TARGETS, &NO_BLOBS, Trust::Read, now)
    }

    /// Checks one append (whose fingerprint is `request_hash` when it has an idempotency key)
    /// against the state this batch has reached and plans its writes. `reads` is the open transaction, if any; without one, a fact not remembered stops the
    /// check with [`Stop::NeedsRead`].
    async fn append(
        &mut self,
        reads: &mut Option<&mut SqliteConnection>,
        request: &mut AppendRequest,
        request_hash: Option<Hash>,
    ) -> Step<AppendOutcome> {
        let session = request.session;
        if let (Some(key), Some(hash)) = (&request.idempotency_key, &request_hash) {
            let record = (session, key.clone());
            let previous = match self.keys.get(&record) {
                Some((stored, outcome)) => Some((*stored, outcome.clone())),
                None => match (self.trust, reads.as_deref_mut()) {
                    (Trust::Guard, _) => {
                        self.unused_keys.push(record);
                        None
                    }
                    (Trust::Read, Some(conn)) => idempotency_record(conn, session, key).await?,
                    (Trust::Read, None) => return Err(Stop::NeedsRead),
                },
            };
            if let Some((stored, outcome)) = previous {
                if stored != *hash {
                    return Err(domain::Error::FailedPrecondition(format!(
                        "idempotency_key: {key:?} was used for a different request"
                    ))
                    .into());
                }
                return Ok(outcome);
            }
        }
        let written = self
            .nodes(
                reads,
                session,
                &request.target,
                request.expected_head,
                &mut request.nodes,
                &|i| format!("nodes[{i}]"),
            )
            .await?;
        let (head_id, head_hash) = *written.last().expect("an append writes a node");
        let outcome = AppendOutcome {
            node_ids: written.iter().map(|(id, _)| id.to_string()).collect(),
            head_id: head_id.to_string(),
            head_hash: head_hash.to_hex(),
        };
        if let (Some(key), Some(hash)) = (&request.idempotency_key, request_hash) {
            self.pending.idempotency.push(IdempotencyRow {
                session,
                key: key.clone(),
                request_hash: hash,
                response: serde_json::to_string(&outcome).expect("an outcome serializes"),
                created_at_ms: self.now,
            });
            self.keys
                .insert((session, key.clone()), (hash, outcome.clone()));
        }
        Ok(outcome)
    }

    /// Checks `nodes` after the target's head and plans their writes and the head's move
    /// (nothing is planned unless all pass); returns each node's id and hash. `field_of(i)`
    /// names node `i` in errors.
    async fn nodes(
        &mut self,
        reads: &mut Option<&mut SqliteConnection>,
        session: SessionId,
        target: &AppendTarget,
        expected_head: Option<Option<NodeId>>,
        nodes: &mut [NodeContent],
        field_of: &(dyn Fn(usize) -> String + Sync),
    ) -> Step<Vec<(NodeId, Hash)>> {
        if nodes.is_empty() {
            return Err(domain::Error::invalid("nodes", "is empty").into());
        }
        let key = (session, target.clone());
        let found = match self.state(reads, &key).await {
            // The session is checked only when its branch or function is missing: the common
            // path saves the query, and an unknown session is still named as such.
            Err(Stop::Error(Error::Domain(domain::Error::NotFound { what, id }))) => {
                if let Some(conn) = reads.as_deref_mut()
                    && ensure_session(conn, session).await.is_err()
                {
                    return Err(domain::Error::not_found("session", session).into());
                }
                return Err(domain::Error::NotFound { what, id }.into());
            }
            other => other?,
        };
        let scope = match target {
            AppendTarget::Branch(_) => None,
            AppendTarget::Function(function) => {
                if found.closed || self.closed.contains(&(session, *function)) {
                    return Err(domain::Error::FailedPrecondition(format!(
                        "function_id: function {function} is closed by its function_result"
                    ))
                    .into());
                }
                Some(*function)
            }
        };
        let TargetState {
            head,
            head_hash,
            scope_hash,
            mut tail,
        } = found.state;
        if let Some(expected) = expected_head
            && expected != head
        {
            let show = |h: Option<NodeId>| h.map_or_else(|| "none".to_owned(), |id| id.to_string());
            return Err(domain::Error::Aborted(format!(
                "expected_head_id: the head is {}, not {}",
                show(head),
                show(expected)
            ))
            .into());
        }
        let mut parent = match scope {
            None => head,
            Some(function) => Some(head.unwrap_or(function)),
        };
        let mut parent_hash = head_hash;
        // Check every node first, so a refused append plans nothing.
        let mut planned = Vec::with_capacity(nodes.len());
        // Functions opened by this very request, with their call node's hash.
        let mut opened: HashMap<NodeId, Hash> = HashMap::new();
        for (i, content) in nodes.iter_mut().enumerate() {
            let field = field_of(i);
            let id = NodeId::new();
            let admit = tail.admit(&field, id, content)?;
            if let Admit::ClosesFunction(function) = admit {
                let chain = match opened.get(&function) {
                    // Opened in this request: nothing can be inside it yet.
                    Some(call_hash) => ClosedChain {
                        function_id: function,
                        head_id: None,
                        head_hash: *call_hash,
                    },
                    None => self.closing_chain(reads, session, function, &field).await?,
                };
                if let NodeContent::FunctionResult(result) = content {
                    result.chain = Some(chain);
                }
            }
            let hash = node_hash(parent_hash.as_ref(), scope_hash.as_ref(), content);
            if admit == Admit::OpensFunction {
                opened.insert(id, hash);
            }
            planned.push((id, parent, hash, admit));
            parent = Some(id);
            parent_hash = Some(hash);
        }
        let mut written = Vec::with_capacity(planned.len());
        for ((id, parent, hash, admit), content) in planned.into_iter().zip(nodes.iter()) {
            self.pending.node(
                self.blobs,
                NodeInsert {
                    id,
                    session,
                    parent,
                    function: scope,
                    created_at_ms: self.now,
                    hash,
                },
                content,
            );
            match admit {
                Admit::Plain => {}
                Admit::OpensFunction => self.pending.opened.push((id, session)),
                Admit::ClosesFunction(function) => {
                    self.pending.closes.push((id, function));
                    self.closed.insert((session, function));
                }
            }
            written.push((id, hash));
        }
        let head_id = written.last().map(|(id, _)| *id);
        let new_head = head_id.expect("nodes is not empty");
        match target {
            AppendTarget::Branch(name) => {
                self.pending
                    .branch_heads
                    .insert((session, name.clone()), (new_head, self.now));
            }
            AppendTarget::Function(function) => {
                self.pending.function_heads.insert(*function, new_head);
            }
        }
        self.seen.insert(
            key,
            Seen {
                state: TargetState {
                    head: head_id,
                    head_hash: parent_hash,
                    scope_hash,
                    tail,
                },
                closed: false,
            },
        );
        Ok(written)
    }

    /// The state of `key` as this batch stands: as it left or found it, else remembered (on
    /// trust, or after reading the head), else read.
    async fn state(
        &mut self,
        reads: &mut Option<&mut SqliteConnection>,
        key: &TargetKey,
    ) -> Step<Seen> {
        if let Some(seen) = self.seen.get(key) {
            return Ok(seen.clone());
        }
        let remembered = self.targets.0.get(key);
        if self.trust == Trust::Guard
            && let Some(state) = remembered
        {
            self.guarded.push((key.clone(), state.head));
            return Ok(self.saw(key, state.clone(), false));
        }
        let Some(conn) = reads.as_deref_mut() else {
            return Err(Stop::NeedsRead);
        };
        let (session, target) = key;
        let (head, closed) = match target {
            AppendTarget::Branch(name) => (branch_head(conn, *session, name).await?, false),
            AppendTarget::Function(function) => function_row(conn, *session, *function).await?,
        };
        let state = match remembered.filter(|state| state.head == head) {
            Some(state) => state.clone(),
            None => read_state(conn, *session, target, head).await?,
        };
        Ok(self.saw(key, state, closed))
    }

    fn saw(&mut self, key: &TargetKey, state: TargetState, closed: bool) -> Seen {
        let seen = Seen { state, closed };
        self.seen.insert(key.clone(), seen.clone());
        seen
    }

    /// What a result closing `function` records; its chain must have no pending calls.
    async fn closing_chain(
        &mut self,
        reads: &mut Option<&mut SqliteConnection>,
        session: SessionId,
        function: NodeId,
        field: &str,
    ) -> Step<ClosedChain> {
        let inner = self
            .state(reads, &(session, AppendTarget::Function(function)))
            .await?
            .state;
        let pending = inner.tail.pending();
        if !pending.is_empty() {
            return Err(domain::Error::FailedPrecondition(format!(
                "{field}: function {function} has unanswered tool calls inside ({}); answer them first",
                pending.join(", ")
            ))
            .into());
        }
        Ok(ClosedChain {
            function_id: function,
            head_id: inner.head,
            head_hash: inner
                .head_hash
                .ok_or_else(|| Error::Corrupt(format!("function {function} has no hash")))?,
        })
    }

    /// The guard: one statement per [`CONDITIONS_PER_GUARD`] facts taken on trust, failing
    /// (with SQLite's integer overflow error, from `abs`) unless all still hold.
    fn push_guards(&self, sql: &mut QueryBuilder<Sqlite>) {
        enum Fact<'a> {
            Head(&'a TargetKey, Option<NodeId>),
            Unused(&'a (SessionId, String)),
        }
        let facts: Vec<Fact<'_>> = self
            .guarded
            .iter()
            .map(|(key, head)| Fact::Head(key, *head))
            .chain(self.unused_keys.iter().map(Fact::Unused))
            .collect();
        for chunk in facts.chunks(CONDITIONS_PER_GUARD) {
            sql.push("SELECT abs(CASE WHEN ");
            for (i, fact) in chunk.iter().enumerate() {
                if i > 0 {
                    sql.push(" AND ");
                }
                match fact {
                    Fact::Head((session, AppendTarget::Branch(name)), head) => {
                        sql.push("EXISTS (SELECT 1 FROM branches WHERE session_id = ")
                            .push_bind(session.as_bytes().to_vec())
                            .push(" AND name = ")
                            .push_bind(name.as_str().to_owned())
                            .push(" AND head_id IS ")
                            .push_bind(head.map(|h| h.as_bytes().to_vec()))
                            .push(")");
                    }
                    Fact::Head((session, AppendTarget::Function(function)), head) => {
                        sql.push("EXISTS (SELECT 1 FROM functions WHERE id = ")
                            .push_bind(function.as_bytes().to_vec())
                            .push(" AND session_id = ")
                            .push_bind(session.as_bytes().to_vec())
                            .push(" AND head_id IS ")
                            .push_bind(head.map(|h| h.as_bytes().to_vec()))
                            .push(" AND closed_by IS NULL)");
                    }
                    Fact::Unused((session, key)) => {
                        sql.push("NOT EXISTS (SELECT 1 FROM idempotency WHERE session_id = ")
                            .push_bind(session.as_bytes().to_vec())
                            .push(" AND key = ")
                            .push_bind(key.clone())
                            .push(")");
                    }
                }
            }
            sql.push(" THEN 0 ELSE -9223372036854775807 - 1 END); ");
        }
    }

    /// Checks and writes `nodes` after `target`'s head inside the caller's transaction (an
    /// import's run of nodes); returns each node's id and hash.
    pub(super) async fn write(
        &mut self,
        conn: &mut SqliteConnection,
        session: SessionId,
        target: &AppendTarget,
        nodes: &mut [NodeContent],
        field_of: &(dyn Fn(usize) -> String + Sync),
    ) -> Result<Vec<(NodeId, Hash)>> {
        let mut reads = Some(&mut *conn);
        let written = match self
            .nodes(&mut reads, session, target, None, nodes, field_of)
            .await
        {
            Ok(written) => written,
            Err(Stop::Error(e)) => return Err(e),
            Err(Stop::NeedsRead) => {
                return Err(Error::Corrupt(
                    "a read was refused in an open transaction".into(),
                ));
            }
        };
        let mut sql = QueryBuilder::<Sqlite>::new("");
        self.pending.push_writes(&mut sql);
        sql.build().persistent(false).execute(&mut *conn).await?;
        self.pending = Pending::default();
        Ok(written)
    }
}

/// Whether a failed batch statement is the guard's refusal.
fn is_guard_failure(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.message().contains("integer overflow"))
}

/// The state of `target` at the stored `head`: the hashes new nodes chain from and the chain's
/// pairing state.
async fn read_state(
    conn: &mut SqliteConnection,
    session: SessionId,
    target: &AppendTarget,
    head: Option<NodeId>,
) -> Result<TargetState> {
    let (scope, parent) = match target {
        AppendTarget::Branch(_) => (None, head),
        AppendTarget::Function(function) => (Some(*function), Some(head.unwrap_or(*function))),
    };
    let scope_hash = match scope {
        Some(function) => Some(node_row(conn, session, function, "function_id").await?.hash),
        None => None,
    };
    let head_hash = match parent {
        Some(id) => Some(node_row(conn, session, id, "head").await?.hash),
        None => None,
    };
    let tail = chain_tail(conn, session, head, scope).await?;
    Ok(TargetState {
        head,
        head_hash,
        scope_hash,
        tail,
    })
}

/// The pairing state of a chain whose newest node is `head`: its nodes since the latest message.
async fn chain_tail(
    conn: &mut SqliteConnection,
    session: SessionId,
    head: Option<NodeId>,
    scope: Option<NodeId>,
) -> Result<ChainTail> {
    let mut since_message = Vec::new();
    let mut at = head;
    while let Some(id) = at {
        let row = node_row(conn, session, id, "head").await?;
        if row.function_id != scope {
            break;
        }
        let content = Body::parse(&row.body)?;
        let is_message = matches!(content, Body::Message { .. });
        // Pairing looks at call ids only, so parts need not be fetched.
        let content = content.decode(&|_| Some(Vec::new()))?;
        since_message.push((row.id, content));
        if is_message {
            break;
        }
        at = row.parent_id;
    }
    since_message.reverse();
    Ok(ChainTail::replay(
        since_message.iter().map(|(id, content)| (*id, content)),
    ))
}

/// The stored record of an idempotency key: the request's fingerprint and the first answer.
async fn idempotency_record(
    conn: &mut SqliteConnection,
    session: SessionId,
    key: &str,
) -> Result<Option<(Hash, AppendOutcome)>> {
    let row = sqlx::query(
        "SELECT request_hash, response FROM idempotency WHERE session_id = ? AND key = ?",
    )
    .bind(session.as_bytes().as_slice())
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let stored: Vec<u8> = row.try_get("request_hash")?;
    let stored = <[u8; 32]>::try_from(stored.as_slice())
        .map(Hash)
        .map_err(|_| Error::Corrupt("an idempotency request hash is not 32 bytes".into()))?;
    let response: String = row.try_get("response")?;
    let outcome = serde_json::from_str(&response)
        .map_err(|e| Error::Corrupt(format!("idempotency response: {e}")))?;
    Ok(Some((stored, outcome)))
}

/// What an idempotent retry must repeat exactly: target, expectation and content.
fn request_fingerprint(
    target: &AppendTarget,
    expected: Option<Option<NodeId>>,
    nodes: &[NodeContent],
) -> Hash {
    let mut h = blake3::Hasher::new();
    match target {
        AppendTarget::Branch(name) => h.update(b"b").update(name.as_str().as_bytes()),
        AppendTarget::Function(id) => h.update(b"f").update(id.as_bytes()),
    };
    match expected {
        None => h.update(b"-"),
        Some(None) => h.update(b"0"),
        Some(Some(id)) => h.update(b"1").update(id.as_bytes()),
    };
    for node in nodes {
        h.update(&node_hash(None, None, node).0);
    }
    Hash(*h.finalize().as_bytes())
}

// ---------------------------------------------------------------- the rows of a batch

struct NodeInsert {
    id: NodeId,
    session: SessionId,
    parent: Option<NodeId>,
    function: Option<NodeId>,
    created_at_ms: i64,
    hash: Hash,
}

struct NodeRow {
    insert: NodeInsert,
    kind: i64,
    body: String,
    body_z: Option<Vec<u8>>,
}

struct BlobRow {
    hash: Hash,
    size: i64,
    codec: i64,
    data: Vec<u8>,
}

struct IdempotencyRow {
    session: SessionId,
    key: String,
    request_hash: Hash,
    response: String,
    created_at_ms: i64,
}

/// The rows a batch writes, in the order their references need: blobs, nodes, functions
/// opened, functions closed, heads, idempotency records.
#[derive(Default)]
struct Pending {
    blobs: Vec<BlobRow>,
    blob_hashes: HashSet<Hash>,
    nodes: Vec<NodeRow>,
    /// Functions opened: (call node, session).
    opened: Vec<(NodeId, SessionId)>,
    /// Functions closed, in order (the first result is the record): (result node, function).
    closes: Vec<(NodeId, NodeId)>,
    /// New heads of branches, with the time they moved.
    branch_heads: HashMap<(SessionId, BranchName), (NodeId, i64)>,
    function_heads: HashMap<NodeId, NodeId>,
    idempotency: Vec<IdempotencyRow>,
}

impl Pending {
    /// Plans a node and the blobs it refers to that are not known to be stored.
    fn node(&mut self, known: &KnownBlobs, insert: NodeInsert, content: &NodeContent) {
        let (json, blobs) = body::encode(content);
        for (hash, data) in blobs {
            if known.0.contains(&hash) || !self.blob_hashes.insert(hash) {
                continue;
            }
            let (codec, stored) = compress(data);
            self.blobs.push(BlobRow {
                hash,
                size: i64::try_from(data.len()).unwrap_or(i64::MAX),
                codec,
                data: stored.into_owned(),
            });
        }
        // Long bodies hold tool-call arguments (whole files, for an editor's tools): compress them.
        let (body, body_z) = match compress(json.as_bytes()) {
            (CODEC_ZSTD, packed) => (String::new(), Some(packed.into_owned())),
            _ => (json, None),
        };
        self.nodes.push(NodeRow {
            insert,
            kind: body::kind_code(content.kind()),
            body,
            body_z,
        });
    }

    /// The batch's writes as statements, each ending in `; `.
    fn push_writes(&self, sql: &mut QueryBuilder<Sqlite>) {
        let id = |id: NodeId| id.as_bytes().to_vec();
        for chunk in self.blobs.chunks(ROWS_PER_STATEMENT) {
            sql.push("INSERT INTO blobs (hash, size, codec, data) ");
            sql.push_values(chunk, |mut row, blob| {
                row.push_bind(blob.hash.0.to_vec())
                    .push_bind(blob.size)
                    .push_bind(blob.codec)
                    .push_bind(blob.data.clone());
            });
            sql.push(" ON CONFLICT (hash) DO NOTHING; ");
        }
        for chunk in self.nodes.chunks(ROWS_PER_STATEMENT) {
            sql.push(
                "INSERT INTO nodes (id, session_id, parent_id, function_id, kind, created_at_ms,
                     hash, body, body_z) ",
            );
            sql.push_values(chunk, |mut row, node| {
                let n = &node.insert;
                row.push_bind(id(n.id))
                    .push_bind(n.session.as_bytes().to_vec())
                    .push_bind(n.parent.map(id))
                    .push_bind(n.function.map(id))
                    .push_bind(node.kind)
                    .push_bind(n.created_at_ms)
                    .push_bind(n.hash.0.to_vec())
                    .push_bind(node.body.clone())
                    .push_bind(node.body_z.clone());
            });
            sql.push("; ");
        }
        for chunk in self.opened.chunks(ROWS_PER_STATEMENT) {
            sql.push("INSERT INTO functions (id, session_id) ");
            sql.push_values(chunk, |mut row, (function, session)| {
                row.push_bind(id(*function))
                    .push_bind(session.as_bytes().to_vec());
            });
            sql.push("; ");
        }
        for (result, function) in &self.closes {
            // Another branch may have closed it already; the first result is the record.
            sql.push("UPDATE functions SET closed_by = ")
                .push_bind(id(*result))
                .push(" WHERE id = ")
                .push_bind(id(*function))
                .push(" AND closed_by IS NULL; ");
        }
        let branch_heads: Vec<_> = self.branch_heads.iter().collect();
        for chunk in branch_heads.chunks(ROWS_PER_STATEMENT) {
            sql.push("UPDATE branches SET head_id = v.column3, updated_at_ms = v.column4 FROM (");
            sql.push_values(chunk, |mut row, ((session, name), (head, at))| {
                row.push_bind(session.as_bytes().to_vec())
                    .push_bind(name.as_str().to_owned())
                    .push_bind(id(*head))
                    .push_bind(*at);
            });
            sql.push(
                ") AS v WHERE branches.session_id = v.column1 AND branches.name = v.column2; ",
            );
        }
        let function_heads: Vec<_> = self.function_heads.iter().collect();
        for chunk in function_heads.chunks(ROWS_PER_STATEMENT) {
            sql.push("UPDATE functions SET head_id = v.column2 FROM (");
            sql.push_values(chunk, |mut row, (function, head)| {
                row.push_bind(id(**function)).push_bind(id(**head));
            });
            sql.push(") AS v WHERE functions.id = v.column1; ");
        }
        for chunk in self.idempotency.chunks(ROWS_PER_STATEMENT) {
            sql.push(
                "INSERT INTO idempotency (session_id, key, request_hash, response, created_at_ms) ",
            );
            sql.push_values(chunk, |mut row, record| {
                row.push_bind(record.session.as_bytes().to_vec())
                    .push_bind(record.key.clone())
                    .push_bind(record.request_hash.0.to_vec())
                    .push_bind(record.response.clone())
                    .push_bind(record.created_at_ms);
            });
            sql.push("; ");
        }
    }
}
