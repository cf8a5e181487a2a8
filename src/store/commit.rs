//! The group committer: appends queue for one task, where every one waiting is checked
//! (`batch`) and written in one transaction of the backend's committer connection, and
//! acknowledged after its COMMIT: a batch shares one durable commit (one fsync on SQLite).
//!
//! The backend chooses where the loop runs (SQLite: a thread of its own over a synchronous
//! connection, so a batch makes no thread hop per statement), and whether a batch is split:
//! on a distributed database (Citus) each transaction holds the appends of one shard, so it
//! commits on one node in one phase, and the shards' transactions run at once, one per lane
//! (connection).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::future::join_all;
use tokio::sync::{mpsc, oneshot};

use super::append::{AppendOutcome, AppendRequest, AppendTarget};
use super::backend::CommitterConnection;
use super::batch::{Batch, FoundTarget};
use super::changes::Changes;
use super::clock::now_ms;
use super::idempotency::append_fingerprint;
use super::{Error, Fault, Result};
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

/// Blobs known to be stored, by session and hash. A blob goes only when the last session
/// referring to it is deleted, and a deleted session takes no more appends, so a pair once
/// stored stays true; a blob not known here is written with `ON CONFLICT DO NOTHING` all the
/// same.
#[derive(Default)]
pub(super) struct KnownBlobs(pub(super) HashSet<(SessionId, Hash)>);

/// Blobs remembered at most (48 bytes each); past that the set starts over.
const KNOWN_BLOBS: usize = 200_000;

/// What the committer counts, for tests and operators (also exported as metrics).
#[derive(Debug, Default)]
pub struct CommitStats {
    batches: AtomicU64,
    transactions: AtomicU64,
    conflict_retries: AtomicU64,
}

/// [`CommitStats`] read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitCounts {
    /// Batches taken off the inbox.
    pub batches: u64,
    /// Transactions committed for them (more than batches where a batch is split by shard).
    pub transactions: u64,
    /// Transactions rolled back and tried again because the engine broke a lock cycle or a
    /// concurrent writer took a key first.
    pub conflict_retries: u64,
}

impl CommitStats {
    pub fn counts(&self) -> CommitCounts {
        CommitCounts {
            batches: self.batches.load(Ordering::Relaxed),
            transactions: self.transactions.load(Ordering::Relaxed),
            conflict_retries: self.conflict_retries.load(Ordering::Relaxed),
        }
    }
}

/// Sessions whose shard is remembered at most; past that the map starts over.
const KNOWN_SHARDS: usize = 100_000;

/// One transaction's worth of a batch: its appends, with where each came in.
struct Group {
    requests: Vec<AppendRequest>,
    fingerprints: Vec<Option<Hash>>,
    replies: Vec<oneshot::Sender<Result<AppendOutcome>>>,
}

/// Takes appends off the inbox and writes every one waiting in one transaction per shard (one
/// in all on an undistributed database), then one COMMIT each; stops when told to close or
/// when every sender is gone. `lanes` are the connections shards' transactions run on at once.
pub(super) async fn group_committer(
    mut lanes: Vec<Box<dyn CommitterConnection>>,
    mut inbox: mpsc::Receiver<Message>,
    changes: Changes,
    stats: Arc<CommitStats>,
) {
    assert!(!lanes.is_empty(), "the committer has a connection");
    let mut targets = TargetCache::default();
    let mut blobs = KnownBlobs::default();
    let mut shards: HashMap<SessionId, i64> = HashMap::new();
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
        stats.batches.fetch_add(1, Ordering::Relaxed);
        let groups = split_by_shard(&mut *lanes[0], &mut shards, batch).await;
        // Each lane writes its share of the groups one after another; the lanes run at once.
        let lane_count = lanes.len();
        let mut shares: Vec<Vec<Group>> = (0..lane_count).map(|_| Vec::new()).collect();
        for (i, group) in groups.into_iter().enumerate() {
            shares[i % lane_count].push(group);
        }
        let (targets_now, blobs_now, stats_now) = (&targets, &blobs, &*stats);
        let written = join_all(
            lanes
                .iter_mut()
                .zip(shares)
                .map(|(conn, share)| async move {
                    let mut done = Vec::with_capacity(share.len());
                    for mut group in share {
                        let result = write_batch(
                            &mut **conn,
                            &mut group.requests,
                            &group.fingerprints,
                            targets_now,
                            blobs_now,
                            stats_now,
                        )
                        .await;
                        done.push((group.replies, result));
                    }
                    done
                }),
        )
        .await;
        for (replies, result) in written.into_iter().flatten() {
            answer(&changes, &mut targets, &mut blobs, replies, result);
        }
    }
    for conn in lanes {
        conn.close().await;
    }
    if let Some(reply) = closing {
        let _ = reply.send(());
    }
}

/// The batch as transactions: one per shard where the database is distributed (a session's
/// appends stay together and in order), else one.
async fn split_by_shard(
    conn: &mut dyn CommitterConnection,
    shards: &mut HashMap<SessionId, i64>,
    batch: Vec<Job>,
) -> Vec<Group> {
    let group = |jobs: Vec<Job>| {
        let mut group = Group {
            requests: Vec::with_capacity(jobs.len()),
            fingerprints: Vec::with_capacity(jobs.len()),
            replies: Vec::with_capacity(jobs.len()),
        };
        for job in jobs {
            group.requests.push(job.request);
            group.fingerprints.push(job.fingerprint);
            group.replies.push(job.reply);
        }
        group
    };
    if !conn.sharded() {
        return vec![group(batch)];
    }
    let mut unknown: Vec<SessionId> = batch
        .iter()
        .map(|job| job.request.session.id())
        .filter(|session| !shards.contains_key(session))
        .collect();
    unknown.sort_unstable();
    unknown.dedup();
    if !unknown.is_empty() {
        if shards.len() + unknown.len() > KNOWN_SHARDS {
            shards.clear();
        }
        match conn.shards(&unknown).await {
            Ok(found) => shards.extend(unknown.iter().copied().zip(found)),
            // Not knowing the shard costs only concurrency: such a session's appends form a
            // transaction of their own, which is on one shard all the same.
            Err(e) => tracing::warn!(error = %e, "looking up sessions' shards failed"),
        }
    }
    let mut by_shard: Vec<(Transaction, Vec<Job>)> = Vec::new();
    for job in batch {
        let session = job.request.session.id();
        let key = match shards.get(&session) {
            Some(shard) => Transaction::Shard(*shard),
            None => Transaction::Session(session),
        };
        match by_shard.iter_mut().find(|(k, _)| *k == key) {
            Some((_, jobs)) => jobs.push(job),
            None => by_shard.push((key, vec![job])),
        }
    }
    by_shard.into_iter().map(|(_, jobs)| group(jobs)).collect()
}

/// What a batch's transaction holds the appends of.
#[derive(PartialEq, Eq)]
enum Transaction {
    Shard(i64),
    /// A session whose shard is not known.
    Session(SessionId),
}

/// Answers the appends of one transaction (after its COMMIT, or with why it failed) and
/// remembers what it committed.
fn answer(
    changes: &Changes,
    targets: &mut TargetCache,
    blobs: &mut KnownBlobs,
    replies: Vec<oneshot::Sender<Result<AppendOutcome>>>,
    result: Result<CommittedBatch>,
) {
    match result {
        Ok(done) => {
            done.remember(targets, blobs);
            // After the COMMIT: a watcher woken now reads the batch.
            let sessions: HashSet<SessionId> = done.seen.keys().map(|key| key.0).collect();
            for session in sessions {
                changes.touched(session);
            }
            for (reply, outcome) in replies.into_iter().zip(done.outcomes) {
                // The caller may have gone (cancelled); its append is durable all the same,
                // and a retry with its idempotency key returns this answer.
                let _ = reply.send(outcome);
            }
        }
        Err(e) => {
            // Kept with each answer: a full disk and a busy lock are told apart from a defect.
            // A rolled-back batch changed nothing the caches remember.
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

/// Checks and writes one batch, committed as a whole; each append's answer is its outcome or
/// the rule it broke (a refused append writes nothing, so the others stay whole). An error
/// means nothing of the batch was written.
async fn write_batch(
    conn: &mut dyn CommitterConnection,
    requests: &mut [AppendRequest],
    fingerprints: &[Option<Hash>],
    targets: &TargetCache,
    blobs: &KnownBlobs,
    stats: &CommitStats,
) -> Result<CommittedBatch> {
    let mut attempt = 1;
    loop {
        conn.begin().await?;
        let written = check_and_write(conn, requests, fingerprints, targets, blobs).await;
        if written.is_err() {
            conn.rollback().await;
        }
        match written {
            // The engine broke a lock cycle with another writer, or another writer took an
            // idempotency key first: nothing was written, so the batch is checked and written
            // again from what is stored now. (Targets are locked in one order, so a cycle
            // needs a function a result closes, which is locked when it is found.)
            Err(e) if e.fault() == Some(Fault::Conflict) && attempt < BATCH_ATTEMPTS => {
                tracing::warn!(error = %e, attempt, "group commit conflicted; retrying");
                stats.conflict_retries.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("ctxd_commit_retries_total").increment(1);
                attempt += 1;
            }
            Ok(done) => {
                stats.transactions.fetch_add(1, Ordering::Relaxed);
                return Ok(done);
            }
            other => return other,
        }
    }
}

/// Tries of a batch that conflicted with another writer.
const BATCH_ATTEMPTS: u32 = 4;

async fn check_and_write(
    conn: &mut dyn CommitterConnection,
    requests: &mut [AppendRequest],
    fingerprints: &[Option<Hash>],
    targets: &TargetCache,
    blobs: &KnownBlobs,
) -> Result<CommittedBatch> {
    let mut batch = Batch::new(targets, blobs, now_ms());
    batch.lock_targets(conn, requests).await?;
    let mut outcomes = Vec::with_capacity(requests.len());
    for (request, fingerprint) in requests.iter_mut().zip(fingerprints) {
        match batch.append(conn, request, *fingerprint).await {
            Ok(outcome) => outcomes.push(Ok(outcome)),
            Err(Error::Domain(e)) => outcomes.push(Err(e.into())),
            Err(e) => return Err(e),
        }
    }
    conn.write_rows(&batch.pending).await?;
    conn.commit().await?;
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
    blobs: HashSet<(SessionId, Hash)>,
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
