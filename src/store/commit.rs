//! The group committer: appends queue for one task, where every one waiting is checked
//! (`batch`) and written in one transaction of the backend's committer connection, and
//! acknowledged after its COMMIT: a batch shares one durable commit (one fsync on SQLite).
//!
//! The backend chooses where the loop runs (SQLite: a thread of its own over a synchronous
//! connection, so a batch makes no thread hop per statement).

use std::collections::{HashMap, HashSet};

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

/// Takes appends off the inbox and writes every one waiting in one transaction, then one
/// COMMIT for all; stops when told to close or when every sender is gone.
pub(super) async fn group_committer(
    mut conn: Box<dyn CommitterConnection>,
    mut inbox: mpsc::Receiver<Message>,
    changes: Changes,
) {
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
        match write_batch(&mut *conn, &mut requests, &fingerprints, &targets, &blobs).await {
            Ok(done) => {
                done.remember(&mut targets, &mut blobs);
                // After the COMMIT: a watcher woken now reads the batch.
                let sessions: HashSet<SessionId> = done.seen.keys().map(|key| key.0).collect();
                for session in sessions {
                    changes.touched(session);
                }
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
    conn.close().await;
    if let Some(reply) = closing {
        let _ = reply.send(());
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
) -> Result<CommittedBatch> {
    let mut attempt = 1;
    loop {
        conn.begin().await?;
        let written = check_and_write(conn, requests, fingerprints, targets, blobs).await;
        if written.is_err() {
            conn.rollback().await;
        }
        match written {
            // The engine broke a lock cycle with another writer (another replica's batch took
            // the same branches in another order): nothing was written, so the batch is
            // checked and written again from what is stored now.
            Err(e) if e.fault() == Some(Fault::Conflict) && attempt < BATCH_ATTEMPTS => {
                tracing::warn!(error = %e, attempt, "group commit conflicted; retrying");
                attempt += 1;
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
