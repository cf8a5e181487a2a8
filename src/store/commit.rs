//! The group committer: appends queue for a thread of its own, where every one waiting is
//! checked (`batch`) and written (`writes`) in one transaction, acknowledged after its COMMIT.
//!
//! The committer owns a synchronous SQLite connection (rusqlite, on the same libsqlite3 as
//! sqlx) on a thread of its own. A batch is read, checked and written there in one
//! `BEGIN IMMEDIATE … COMMIT` without a thread hop per statement: an append costs its caller
//! one wake-up of the committer and one of its own, plus the batch's share of one fsync. Other
//! writes use the sqlx writer connection; both take the store's write lock first, so they
//! queue in order instead of sleeping in SQLite's busy handler behind each other.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rusqlite::TransactionBehavior;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::append::{AppendOutcome, AppendRequest, AppendTarget};
use super::batch::{AppendTx, Batch, FoundTarget};
use super::clock::now_ms;
use super::fault::{Fault, Quota};
use super::idempotency::append_fingerprint;
use super::open::Config;
use super::writes::CommitterTx;
use super::{Error, Result};
use crate::domain::{ChainTail, Hash, NodeId, SessionId};

/// One append waiting for the group committer.
pub(super) struct Job {
    request: AppendRequest,
    /// With an idempotency key: what a retry must repeat ([`append_fingerprint`]).
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
            .map(|_| append_fingerprint(&request));
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

pub(super) type TargetKey = (SessionId, AppendTarget);

/// What the committer remembers of an append target: its head, the hashes new nodes chain
/// from, and its pairing state. All of it follows from the head, so it is used only while the
/// stored head is still `head`.
#[derive(Clone)]
pub(super) struct TargetState {
    pub(super) head: Option<NodeId>,
    pub(super) head_hash: Option<Hash>,
    pub(super) scope_hash: Option<Hash>,
    pub(super) tail: ChainTail,
}

#[derive(Default)]
pub(super) struct TargetCache(pub(super) HashMap<TargetKey, TargetState>);

/// Targets remembered at most; past that the cache starts over.
const CACHE_TARGETS: usize = 100_000;

/// Hashes of blobs known to be stored. Blobs are never deleted, so a hash once stored stays
/// true; a blob not known here is written with `ON CONFLICT DO NOTHING` all the same.
#[derive(Default)]
pub(super) struct KnownBlobs(pub(super) HashSet<Hash>);

/// Blob hashes remembered at most (32 bytes each); past that the set starts over.
const KNOWN_BLOBS: usize = 200_000;

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
) -> Result<CommittedBatch> {
    let now = now_ms();
    // Dropped without COMMIT on any error below, the transaction rolls back (unless SQLite
    // already did).
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut direct = CommitterTx(&tx);
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
    Ok(CommittedBatch {
        outcomes,
        seen: batch.seen,
        closed: batch.closed,
        blobs: batch.pending.blob_hashes,
    })
}

/// A batch written and committed.
struct CommittedBatch {
    outcomes: Vec<Result<AppendOutcome>>,
    seen: HashMap<TargetKey, FoundTarget>,
    closed: HashSet<(SessionId, NodeId)>,
    blobs: HashSet<Hash>,
}

impl CommittedBatch {
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
