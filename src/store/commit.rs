//! The append write path: the group committer on its own thread, the checks an append passes,
//! and the rows a batch of appends writes.
//!
//! The committer owns a synchronous SQLite connection (rusqlite, on the same libsqlite3 as
//! sqlx) on a thread of its own. A batch is read, checked and written there in one
//! `BEGIN IMMEDIATE … COMMIT` without a thread hop per statement: an append costs its caller
//! one wake-up of the committer and one of its own, plus the batch's share of one fsync. Other
//! writes use the sqlx writer connection; both take the store's write lock first, so they
//! queue in order instead of sleeping in SQLite's busy handler behind each other.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rusqlite::{OptionalExtension, TransactionBehavior};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use tokio::sync::{Mutex, mpsc, oneshot};

use super::append::{AppendOutcome, AppendRequest, AppendTarget};
use super::body::{self, Body};
use super::clock::now_ms;
use super::codec::{CODEC_ZSTD, compress};
use super::fault::{Fault, Quota};
use super::open::Config;
use super::rows::{self, NodeColumns, NodeRow, hash_from, uuid_from};
use super::{Error, Result};
use crate::domain::{
    self, Admit, BranchName, ChainTail, ClosedChain, Hash, NodeContent, NodeId, SessionId,
    node_hash,
};

/// One append waiting for the group committer.
pub(super) struct Job {
    request: AppendRequest,
    /// With an idempotency key: what a retry must repeat ([`request_fingerprint`]).
    fingerprint: Option<Hash>,
    reply: oneshot::Sender<Result<AppendOutcome>>,
}

impl Job {
    /// An append for the committer, fingerprinted here, in the caller's task: hashing the
    /// content is work the committer's one thread need not do.
    pub(super) fn new(
        request: AppendRequest,
        reply: oneshot::Sender<Result<AppendOutcome>>,
    ) -> Self {
        // As sent: the checks fill in result names later.
        let fingerprint = request
            .idempotency_key
            .as_ref()
            .map(|_| request_fingerprint(&request));
        Self {
            request,
            fingerprint,
            reply,
        }
    }
}

/// What the committer is sent.
pub(super) enum Message {
    Append(Job),
    /// Finish the batch in hand, close the connection, then answer.
    Close(oneshot::Sender<()>),
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

/// Rows a multi-row statement of an import carries at most: 9 columns a node, well under
/// SQLite's limit of bound parameters per statement.
const ROWS_PER_STATEMENT: usize = 500;

/// Opens the committer's connection to the migrated database at `path`, with the store's
/// durability: WAL, `synchronous=FULL`, foreign keys, the busy timeout.
pub(super) fn connect(
    path: &std::path::Path,
    config: &Config,
) -> rusqlite::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    // WAL is a property of the file, set when the writer pool opened it.
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.busy_timeout(config.busy_timeout)?;
    // A batch uses about a dozen statements; keep them all prepared.
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

/// Starts the group committer on a thread of its own, writing with `conn`; it stops when
/// told to close or when every sender is gone.
pub(super) fn spawn(
    conn: rusqlite::Connection,
    lock: Arc<Mutex<()>>,
    quota: Arc<Quota>,
    inbox: mpsc::Receiver<Message>,
) -> std::io::Result<()> {
    // The committer's only waits are its inbox and the write lock: a runtime with no I/O or
    // timer driver parks the thread on them.
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    std::thread::Builder::new()
        .name("ctxd-committer".into())
        .spawn(move || runtime.block_on(group_committer(conn, lock, quota, inbox)))?;
    Ok(())
}

/// Takes appends off the inbox and writes every one waiting in one transaction, then one
/// COMMIT (one fsync) for all.
async fn group_committer(
    conn: rusqlite::Connection,
    lock: Arc<Mutex<()>>,
    quota: Arc<Quota>,
    mut inbox: mpsc::Receiver<Message>,
) {
    let mut conn = Writer { conn, quota: None };
    let mut targets = TargetCache::default();
    let mut blobs = KnownBlobs::default();
    let mut closing = None;
    while closing.is_none() {
        let mut batch = Vec::new();
        match inbox.recv().await {
            Some(Message::Append(job)) => batch.push(job),
            Some(Message::Close(reply)) => closing = Some(reply),
            None => break,
        }
        while closing.is_none() && !batch.is_empty() && batch.len() < MAX_BATCH {
            match inbox.try_recv() {
                Ok(Message::Append(job)) => batch.push(job),
                Ok(Message::Close(reply)) => closing = Some(reply),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            continue;
        }
        let mut requests = Vec::with_capacity(batch.len());
        let mut fingerprints = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        for job in batch {
            requests.push(job.request);
            fingerprints.push(job.fingerprint);
            replies.push(job.reply);
        }
        let written = {
            let _write = lock.lock().await;
            match conn.take_quota(&quota) {
                Ok(()) => {
                    write_batch(
                        &mut conn.conn,
                        &mut requests,
                        &fingerprints,
                        &targets,
                        &blobs,
                    )
                    .await
                }
                Err(e) => Err(e),
            }
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
    }
    if let Err((_, e)) = conn.conn.close() {
        tracing::error!(error = %e, "closing the committer's connection failed");
    }
    if let Some(reply) = closing {
        let _ = reply.send(());
    }
}

/// The committer's connection and the size quota last set on it.
struct Writer {
    conn: rusqlite::Connection,
    quota: Option<Option<u64>>,
}

impl Writer {
    /// Sets the store's current quota on the connection if it changed since the last batch.
    fn take_quota(&mut self, quota: &Quota) -> Result<()> {
        let wanted = quota.get();
        if self.quota != Some(wanted) {
            quota.apply_direct(&self.conn)?;
            self.quota = Some(wanted);
        }
        Ok(())
    }
}

/// Checks and writes one batch, committed as a whole; each append's answer is its outcome or
/// the rule it broke (a refused append writes nothing, so the others stay whole). An error
/// means nothing of the batch was written.
async fn write_batch(
    conn: &mut rusqlite::Connection,
    requests: &mut [AppendRequest],
    fingerprints: &[Option<Hash>],
    targets: &TargetCache,
    blobs: &KnownBlobs,
) -> Result<Written> {
    let now = now_ms();
    // Dropped without COMMIT on any error below, the transaction rolls back (unless SQLite
    // already did).
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut direct = Direct(&tx);
    let mut batch = Batch::new(targets, blobs, now);
    let mut outcomes = Vec::with_capacity(requests.len());
    for (request, fingerprint) in requests.iter_mut().zip(fingerprints) {
        match batch.append(&mut direct, request, *fingerprint).await {
            Ok(outcome) => outcomes.push(Ok(outcome)),
            Err(Error::Domain(e)) => outcomes.push(Err(e.into())),
            Err(e) => return Err(e),
        }
    }
    direct.write(&batch.pending).await?;
    tx.commit()?;
    Ok(Written {
        outcomes,
        seen: batch.seen,
        closed: batch.closed,
        blobs: batch.pending.blob_hashes,
    })
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

// ---------------------------------------------------------------- checking a batch

/// A write transaction a batch reads its targets in and writes its rows to: the committer's
/// own connection, or the sqlx writer connection for an import.
pub(super) trait Tx {
    async fn branch_head(
        &mut self,
        session: SessionId,
        name: &BranchName,
    ) -> Result<Option<NodeId>>;
    /// A function's chain head and whether it is closed.
    async fn function_row(
        &mut self,
        session: SessionId,
        function: NodeId,
    ) -> Result<(Option<NodeId>, bool)>;
    /// One node of `session`; `field` names the request field in the not-found error.
    async fn node_row(&mut self, session: SessionId, id: NodeId, field: &str) -> Result<NodeRow>;
    async fn ensure_session(&mut self, session: SessionId) -> Result<()>;
    async fn write(&mut self, pending: &Pending) -> Result<()>;
}

/// A target as this batch found or left it.
#[derive(Clone)]
struct Seen {
    state: TargetState,
    /// A function target closed when it was read.
    closed: bool,
}

/// One batch being checked: the targets as it found and left them, and the rows it will
/// write. Also what an import writes its runs with.
pub(super) struct Batch<'c> {
    targets: &'c TargetCache,
    blobs: &'c KnownBlobs,
    now: i64,
    seen: HashMap<TargetKey, Seen>,
    /// Idempotency records this batch writes.
    keys: HashMap<(SessionId, String), (Hash, AppendOutcome)>,
    /// Functions this batch closes.
    closed: HashSet<(SessionId, NodeId)>,
    pending: Pending,
}

static NO_TARGETS: std::sync::LazyLock<TargetCache> = std::sync::LazyLock::new(Default::default);
static NO_BLOBS: std::sync::LazyLock<KnownBlobs> = std::sync::LazyLock::new(Default::default);

impl<'c> Batch<'c> {
    fn new(targets: &'c TargetCache, blobs: &'c KnownBlobs, now: i64) -> Self {
        Self {
            targets,
            blobs,
            now,
            seen: HashMap::new(),
            keys: HashMap::new(),
            closed: HashSet::new(),
            pending: Pending::default(),
        }
    }

    /// A batch that remembers nothing and reads everything.
    pub(super) fn standalone(now: i64) -> Batch<'static> {
        Batch::new(&NO_TARGETS, &NO_BLOBS, now)
    }

    /// Checks one append (whose fingerprint is `request_hash` when it has an idempotency key)
    /// against the state this batch has reached and plans its writes.
    async fn append(
        &mut self,
        tx: &mut Direct<'_>,
        request: &mut AppendRequest,
        request_hash: Option<Hash>,
    ) -> Result<AppendOutcome> {
        let session = request.session;
        if let (Some(key), Some(hash)) = (&request.idempotency_key, &request_hash) {
            let previous = match self.keys.get(&(session, key.clone())) {
                Some((stored, outcome)) => Some((*stored, outcome.clone())),
                None => tx.idempotency_record(session, key)?,
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
                tx,
                session,
                &request.target,
                request.expected_head,
                &mut request.nodes,
                &|i| format!("nodes[{i}]"),
            )
            .await?;
        let (head_id, head_hash) = *written.last().expect("an append writes a node");
        for &i in &request.pinned {
            if let Some((id, _)) = written.get(i) {
                self.pending.pins.push((session, *id, self.now));
            }
        }
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
        tx: &mut impl Tx,
        session: SessionId,
        target: &AppendTarget,
        expected_head: Option<Option<NodeId>>,
        nodes: &mut [NodeContent],
        field_of: &(dyn Fn(usize) -> String + Sync),
    ) -> Result<Vec<(NodeId, Hash)>> {
        if nodes.is_empty() {
            return Err(domain::Error::invalid("nodes", "is empty").into());
        }
        let key = (session, target.clone());
        let found = match self.state(tx, &key).await {
            // The session is checked only when its branch or function is missing: the common
            // path saves the query, and an unknown session is still named as such.
            Err(Error::Domain(domain::Error::NotFound { what, id })) => {
                if tx.ensure_session(session).await.is_err() {
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
                    None => self.closing_chain(tx, session, function, &field).await?,
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

    /// The state of `key` as this batch stands: as it left or found it, else the remembered
    /// state if the stored head is still its head, else read.
    async fn state(&mut self, tx: &mut impl Tx, key: &TargetKey) -> Result<Seen> {
        if let Some(seen) = self.seen.get(key) {
            return Ok(seen.clone());
        }
        let (session, target) = key;
        let (head, closed) = match target {
            AppendTarget::Branch(name) => (tx.branch_head(*session, name).await?, false),
            AppendTarget::Function(function) => tx.function_row(*session, *function).await?,
        };
        let state = match self.targets.0.get(key).filter(|state| state.head == head) {
            Some(state) => state.clone(),
            None => read_state(tx, *session, target, head).await?,
        };
        let seen = Seen { state, closed };
        self.seen.insert(key.clone(), seen.clone());
        Ok(seen)
    }

    /// What a result closing `function` records; its chain must have no pending calls.
    async fn closing_chain(
        &mut self,
        tx: &mut impl Tx,
        session: SessionId,
        function: NodeId,
        field: &str,
    ) -> Result<ClosedChain> {
        let inner = self
            .state(tx, &(session, AppendTarget::Function(function)))
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

    /// Checks and writes `nodes` after `target`'s head inside the caller's transaction (an
    /// import's run of nodes); returns each node's id and hash.
    pub(super) async fn write(
        &mut self,
        tx: &mut impl Tx,
        session: SessionId,
        target: &AppendTarget,
        nodes: &mut [NodeContent],
        field_of: &(dyn Fn(usize) -> String + Sync),
    ) -> Result<Vec<(NodeId, Hash)>> {
        let written = self
            .nodes(tx, session, target, None, nodes, field_of)
            .await?;
        tx.write(&self.pending).await?;
        self.pending = Pending::default();
        Ok(written)
    }
}

/// The state of `target` at the stored `head`: the hashes new nodes chain from and the chain's
/// pairing state.
async fn read_state(
    tx: &mut impl Tx,
    session: SessionId,
    target: &AppendTarget,
    head: Option<NodeId>,
) -> Result<TargetState> {
    let (scope, parent) = match target {
        AppendTarget::Branch(_) => (None, head),
        AppendTarget::Function(function) => (Some(*function), Some(head.unwrap_or(*function))),
    };
    let scope_hash = match scope {
        Some(function) => Some(tx.node_row(session, function, "function_id").await?.hash),
        None => None,
    };
    let head_hash = match parent {
        Some(id) => Some(tx.node_row(session, id, "head").await?.hash),
        None => None,
    };
    let tail = chain_tail(tx, session, head, scope).await?;
    Ok(TargetState {
        head,
        head_hash,
        scope_hash,
        tail,
    })
}

/// The pairing state of a chain whose newest node is `head`: its nodes since the latest message.
async fn chain_tail(
    tx: &mut impl Tx,
    session: SessionId,
    head: Option<NodeId>,
    scope: Option<NodeId>,
) -> Result<ChainTail> {
    let mut since_message = Vec::new();
    let mut at = head;
    while let Some(id) = at {
        let row = tx.node_row(session, id, "head").await?;
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

/// What an idempotent retry must repeat exactly: target, expectation, content and pins.
fn request_fingerprint(request: &AppendRequest) -> Hash {
    let (target, expected, nodes) = (&request.target, request.expected_head, &request.nodes);
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
    // Appends without pins keep the fingerprints they always had.
    if !request.pinned.is_empty() {
        h.update(b"p");
        for i in &request.pinned {
            h.update(&(*i as u64).to_le_bytes());
        }
    }
    Hash(*h.finalize().as_bytes())
}

// ---------------------------------------------------------------- the two transactions

// Statement heads shared by the committer's one-row inserts and an import's multi-row ones;
// values bind in the order of the columns. Macros, so `concat!` can build whole statements.
macro_rules! insert_blobs {
    () => {
        "INSERT INTO blobs (hash, size, codec, data) "
    };
}
macro_rules! blob_stored_once {
    () => {
        " ON CONFLICT (hash) DO NOTHING"
    };
}
macro_rules! insert_nodes {
    () => {
        "INSERT INTO nodes (id, session_id, parent_id, function_id, kind, created_at_ms, hash, \
         body, body_z) "
    };
}
macro_rules! insert_functions {
    () => {
        "INSERT INTO functions (id, session_id) "
    };
}

/// The sqlx writer connection, in an import's transaction.
impl Tx for SqliteConnection {
    async fn branch_head(
        &mut self,
        session: SessionId,
        name: &BranchName,
    ) -> Result<Option<NodeId>> {
        rows::branch_head(self, session, name).await
    }

    async fn function_row(
        &mut self,
        session: SessionId,
        function: NodeId,
    ) -> Result<(Option<NodeId>, bool)> {
        rows::function_row(self, session, function).await
    }

    async fn node_row(&mut self, session: SessionId, id: NodeId, field: &str) -> Result<NodeRow> {
        rows::node_row(self, session, id, field).await
    }

    async fn ensure_session(&mut self, session: SessionId) -> Result<()> {
        rows::ensure_session(self, session).await
    }

    async fn write(&mut self, pending: &Pending) -> Result<()> {
        let mut sql = QueryBuilder::<Sqlite>::new("");
        pending.push_writes(&mut sql);
        sql.build().persistent(false).execute(&mut *self).await?;
        Ok(())
    }
}

/// The committer's transaction on its own connection. Its statements stay prepared: a batch
/// repeats the same dozen.
struct Direct<'t>(&'t rusqlite::Connection);

fn not_found(what: &'static str, id: impl std::fmt::Display) -> Error {
    domain::Error::not_found(what, id).into()
}

impl Direct<'_> {
    /// The stored record of an idempotency key: the request's fingerprint and the first answer.
    fn idempotency_record(
        &self,
        session: SessionId,
        key: &str,
    ) -> Result<Option<(Hash, AppendOutcome)>> {
        let Some((hash, response)): Option<(Vec<u8>, String)> = self
            .0
            .prepare_cached(
                "SELECT request_hash, response FROM idempotency WHERE session_id = ?1 AND key = ?2",
            )?
            .query_row((session.as_bytes().as_slice(), key), |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?
        else {
            return Ok(None);
        };
        let outcome = serde_json::from_str(&response)
            .map_err(|e| Error::Corrupt(format!("idempotency response: {e}")))?;
        Ok(Some((hash_from(&hash, "request_hash")?, outcome)))
    }
}

impl Tx for Direct<'_> {
    async fn branch_head(
        &mut self,
        session: SessionId,
        name: &BranchName,
    ) -> Result<Option<NodeId>> {
        let head: Option<Vec<u8>> = self
            .0
            .prepare_cached(rows::BRANCH_HEAD)?
            .query_row((session.as_bytes().as_slice(), name.as_str()), |r| r.get(0))
            .optional()?
            .ok_or_else(|| not_found("branch", name))?;
        Ok(uuid_from(head, "head_id")?.map(NodeId::from_bytes))
    }

    async fn function_row(
        &mut self,
        session: SessionId,
        function: NodeId,
    ) -> Result<(Option<NodeId>, bool)> {
        let (head, closed_by): (Option<Vec<u8>>, Option<Vec<u8>>) = self
            .0
            .prepare_cached(rows::FUNCTION_ROW)?
            .query_row(
                (
                    function.as_bytes().as_slice(),
                    session.as_bytes().as_slice(),
                ),
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?
            .ok_or_else(|| not_found("function", function))?;
        Ok((
            uuid_from(head, "head_id")?.map(NodeId::from_bytes),
            closed_by.is_some(),
        ))
    }

    async fn node_row(&mut self, session: SessionId, id: NodeId, field: &str) -> Result<NodeRow> {
        let columns = self
            .0
            .prepare_cached(rows::NODE_ROW)?
            .query_row(
                (id.as_bytes().as_slice(), session.as_bytes().as_slice()),
                |r| {
                    Ok(NodeColumns {
                        id: r.get(0)?,
                        parent_id: r.get(1)?,
                        function_id: r.get(2)?,
                        created_at_ms: r.get(3)?,
                        hash: r.get(4)?,
                        body: r.get(5)?,
                        body_z: r.get(6)?,
                    })
                },
            )
            .optional()?
            .ok_or_else(|| domain::Error::NotFound {
                what: "node",
                id: format!("{id} ({field})"),
            })?;
        NodeRow::from_columns(columns)
    }

    async fn ensure_session(&mut self, session: SessionId) -> Result<()> {
        self.0
            .prepare_cached(rows::SESSION_EXISTS)?
            .query_row([session.as_bytes().as_slice()], |_| Ok(()))
            .optional()?
            .ok_or_else(|| not_found("session", session))
    }

    /// Row by row: a prepared statement's step costs less than parsing a multi-row one.
    async fn write(&mut self, pending: &Pending) -> Result<()> {
        let id = |id: &NodeId| id.as_bytes().to_vec();
        let c = self.0;
        if !pending.blobs.is_empty() {
            let mut insert = c.prepare_cached(concat!(
                insert_blobs!(),
                "VALUES (?, ?, ?, ?)",
                blob_stored_once!()
            ))?;
            for blob in &pending.blobs {
                insert.execute((
                    blob.hash.0.as_slice(),
                    blob.size,
                    blob.codec,
                    blob.data.as_slice(),
                ))?;
            }
        }
        let mut insert = c.prepare_cached(concat!(
            insert_nodes!(),
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        ))?;
        for node in &pending.nodes {
            let n = &node.insert;
            insert.execute((
                id(&n.id),
                n.session.as_bytes().as_slice(),
                n.parent.as_ref().map(id),
                n.function.as_ref().map(id),
                node.kind,
                n.created_at_ms,
                n.hash.0.as_slice(),
                node.body.as_str(),
                node.body_z.as_deref(),
            ))?;
        }
        for (function, session) in &pending.opened {
            c.prepare_cached(concat!(insert_functions!(), "VALUES (?, ?)"))?
                .execute((id(function), session.as_bytes().as_slice()))?;
        }
        for (result, function) in &pending.closes {
            // Another branch may have closed it already; the first result is the record.
            c.prepare_cached(
                "UPDATE functions SET closed_by = ?1 WHERE id = ?2 AND closed_by IS NULL",
            )?
            .execute((id(result), id(function)))?;
        }
        for ((session, name), (head, at)) in &pending.branch_heads {
            c.prepare_cached(
                "UPDATE branches SET head_id = ?1, updated_at_ms = ?2
                 WHERE session_id = ?3 AND name = ?4",
            )?
            .execute((id(head), at, session.as_bytes().as_slice(), name.as_str()))?;
        }
        for (function, head) in &pending.function_heads {
            c.prepare_cached("UPDATE functions SET head_id = ?1 WHERE id = ?2")?
                .execute((id(head), id(function)))?;
        }
        for (session, node, at) in &pending.pins {
            c.prepare_cached(
                "INSERT INTO pins (session_id, node_id, pinned, created_at_ms) VALUES (?1, ?2, 1, ?3)",
            )?
            .execute((session.as_bytes().as_slice(), id(node), at))?;
        }
        for record in &pending.idempotency {
            c.prepare_cached(
                "INSERT INTO idempotency (session_id, key, request_hash, response, created_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute((
                record.session.as_bytes().as_slice(),
                record.key.as_str(),
                record.request_hash.0.as_slice(),
                record.response.as_str(),
                record.created_at_ms,
            ))?;
        }
        Ok(())
    }
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

struct NodeWrite {
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
pub(super) struct Pending {
    blobs: Vec<BlobRow>,
    blob_hashes: HashSet<Hash>,
    nodes: Vec<NodeWrite>,
    /// Functions opened: (call node, session).
    opened: Vec<(NodeId, SessionId)>,
    /// Functions closed, in order (the first result is the record): (result node, function).
    closes: Vec<(NodeId, NodeId)>,
    /// New heads of branches, with the time they moved.
    branch_heads: HashMap<(SessionId, BranchName), (NodeId, i64)>,
    function_heads: HashMap<NodeId, NodeId>,
    /// Nodes pinned as they are appended: (session, node, time).
    pins: Vec<(SessionId, NodeId, i64)>,
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
        self.nodes.push(NodeWrite {
            insert,
            kind: body::kind_code(content.kind()),
            body,
            body_z,
        });
    }

    /// An import's writes as multi-row statements, each ending in `; `. An import plans no
    /// idempotency records: those come from appends, which the committer writes.
    fn push_writes(&self, sql: &mut QueryBuilder<Sqlite>) {
        let id = |id: NodeId| id.as_bytes().to_vec();
        for chunk in self.blobs.chunks(ROWS_PER_STATEMENT) {
            sql.push(insert_blobs!());
            sql.push_values(chunk, |mut row, blob| {
                row.push_bind(blob.hash.0.to_vec())
                    .push_bind(blob.size)
                    .push_bind(blob.codec)
                    .push_bind(blob.data.clone());
            });
            sql.push(concat!(blob_stored_once!(), "; "));
        }
        for chunk in self.nodes.chunks(ROWS_PER_STATEMENT) {
            sql.push(insert_nodes!());
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
            sql.push(insert_functions!());
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
    }
}
