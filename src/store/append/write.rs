//! Writing one batch of the group committer: checked (`batch`) and written in one transaction
//! on a committer connection, tried again when the engine broke a lock cycle; or, where the
//! engine can, planned from what the committer remembers and written by one statement without
//! a read.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;

use super::batch::{Batch, FoundTarget};
use super::commit::{CommitStats, Job};
use super::memory::{KnownBlobs, TargetCache, TargetKey};
use super::planned::{BatchRows, NodeWrite};
use super::request::{AppendOutcome, AppendTarget};
use super::{Error, Fault, Result};
use crate::domain::{BranchName, Hash, NodeId, SessionId};
use crate::store::backend::{AppendTx, CommitterConnection, Lookups};
use crate::store::form::clock::now_ms;
use crate::store::form::rows::NodeRow;

/// Checks and writes one batch, committed as a whole; each append's answer is its outcome or
/// the rule it broke (a refused append writes nothing, so the others stay whole). An error
/// means nothing of the batch was written.
pub(super) async fn write_batch(
    conn: &mut dyn CommitterConnection,
    jobs: &mut [Job],
    targets: &TargetCache,
    blobs: &KnownBlobs,
    stats: &CommitStats,
) -> Result<CommittedBatch> {
    if let Some(done) = write_at_once(conn, jobs, targets, blobs, stats).await? {
        return Ok(done);
    }
    let mut attempt = 1;
    loop {
        conn.begin().await?;
        let written = check_and_write(conn, jobs, targets, blobs).await;
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

/// The batch written by one statement where the engine can and the batch needs no read (see
/// [`plan_at_once`]), committed; `None`: it was not, nothing was written.
pub(super) async fn write_at_once(
    conn: &mut dyn CommitterConnection,
    jobs: &mut [Job],
    targets: &TargetCache,
    blobs: &KnownBlobs,
    stats: &CommitStats,
) -> Result<Option<CommittedBatch>> {
    if !conn.writes_at_once() {
        return Ok(None);
    }
    let done = plan_at_once(conn, jobs, targets, blobs).await?;
    if done.is_some() {
        stats.transactions.fetch_add(1, Ordering::Relaxed);
        stats.at_once.fetch_add(1, Ordering::Relaxed);
    }
    Ok(done)
}

/// The batch written by one statement, when it needs no read: each of its targets is a
/// remembered branch, it carries no idempotency key (whose record would be read), and it
/// writes only nodes, blobs and heads. The statement moves the heads only if each is still the
/// remembered one (otherwise it writes nothing and `None` sends the batch the usual way,
/// reading what is stored). Where the engine pays a round trip per statement (PostgreSQL),
/// this is one in place of BEGIN, a locking read per head, the nodes, the heads and COMMIT.
async fn plan_at_once(
    conn: &mut dyn CommitterConnection,
    jobs: &mut [Job],
    targets: &TargetCache,
    blobs: &KnownBlobs,
) -> Result<Option<CommittedBatch>> {
    // What can be told before planning: remembered branches, no key to look up, no pin. Each
    // branch with the head the plan is judged against, which the write checks (a refusal is
    // confirmed only by a write that checks it: a batch that writes nothing goes the usual
    // way), in the batch's lock order (see `Batch::lock_targets`).
    let mut heads: BTreeMap<(SessionId, BranchName), Option<NodeId>> = BTreeMap::new();
    for request in jobs.iter().flat_map(|job| &job.requests) {
        let AppendTarget::Branch(branch) = &request.target else {
            return Ok(None);
        };
        if request.idempotency_key.is_some() || !request.pinned.is_empty() {
            return Ok(None);
        }
        let session = request.session.id();
        let Some(state) = targets.0.get(&(session, request.target.clone())) else {
            return Ok(None);
        };
        heads.insert((session, branch.clone()), state.head);
    }
    let expected: Vec<(SessionId, BranchName, Option<NodeId>)> = heads
        .into_iter()
        .map(|((session, branch), head)| (session, branch, head))
        .collect();
    let mut batch = Batch::new(targets, blobs, now_ms()).trusting();
    // An error: it needed a read.
    let Ok(outcomes) = check_jobs(&mut batch, &mut NoReads, jobs).await else {
        return Ok(None);
    };
    if batch.pending.nodes.is_empty() {
        return Ok(None);
    }
    // Rows other than nodes, blobs and these heads (a function a result closes, a target whose
    // every append was refused) the backend declines: `None`.
    match conn.write_at_once(&batch.pending, &expected).await {
        Ok(Some(true)) => Ok(Some(CommittedBatch {
            outcomes,
            nodes: batch.pending.nodes,
            seen: batch.seen,
            closed: batch.closed,
            blobs: batch.pending.blob_hashes,
        })),
        Ok(Some(false) | None) => Ok(None),
        // A concurrent write took its rows (a deletion of the session, say): nothing was
        // written, and the usual way reads what it left and answers accordingly.
        Err(e) if e.fault() == Some(Fault::Conflict) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What a batch planned without the database reads through: every read fails, so a plan
/// that needs one is made again the usual way.
struct NoReads;

#[async_trait::async_trait]
impl Lookups for NoReads {
    async fn session_exists(&mut self, _: SessionId) -> Result<bool> {
        Err(NoReads::refused())
    }

    async fn find_branch_head(
        &mut self,
        _: SessionId,
        _: &BranchName,
    ) -> Result<Option<Option<NodeId>>> {
        Err(NoReads::refused())
    }

    async fn find_function(
        &mut self,
        _: SessionId,
        _: NodeId,
    ) -> Result<Option<(Option<NodeId>, bool)>> {
        Err(NoReads::refused())
    }

    async fn find_node(&mut self, _: SessionId, _: NodeId) -> Result<Option<NodeRow>> {
        Err(NoReads::refused())
    }

    async fn idempotency_record(
        &mut self,
        _: SessionId,
        _: &str,
    ) -> Result<Option<(Hash, AppendOutcome)>> {
        Err(NoReads::refused())
    }
}

#[async_trait::async_trait]
impl AppendTx for NoReads {
    async fn write_rows(&mut self, _: &BatchRows) -> Result<()> {
        Err(NoReads::refused())
    }
}

impl NoReads {
    /// Never reaches a caller: [`plan_at_once`] takes any error as "plan the usual way".
    fn refused() -> Error {
        Error::Corrupt("a read while planning a batch without reads".into())
    }
}

/// Tries of a batch that conflicted with another writer.
const BATCH_ATTEMPTS: u32 = 4;

async fn check_and_write(
    conn: &mut dyn CommitterConnection,
    jobs: &mut [Job],
    targets: &TargetCache,
    blobs: &KnownBlobs,
) -> Result<CommittedBatch> {
    let mut batch = Batch::new(targets, blobs, now_ms());
    batch
        .lock_targets(conn, jobs.iter().flat_map(|job| &job.requests))
        .await?;
    let outcomes = check_jobs(&mut batch, conn, jobs).await?;
    conn.write_rows(&batch.pending).await?;
    conn.commit().await?;
    Ok(CommittedBatch {
        outcomes,
        nodes: batch.pending.nodes,
        seen: batch.seen,
        closed: batch.closed,
        blobs: batch.pending.blob_hashes,
    })
}

/// Checks and plans every job's requests in order, each job up to its first refused request;
/// an error (not a refusal) means the batch cannot be planned.
async fn check_jobs(
    batch: &mut Batch<'_>,
    tx: &mut (impl AppendTx + ?Sized),
    jobs: &mut [Job],
) -> Result<Vec<Vec<Result<AppendOutcome>>>> {
    let mut outcomes = Vec::with_capacity(jobs.len());
    for job in jobs.iter_mut() {
        let mut answers = Vec::with_capacity(job.requests.len());
        for (request, fingerprint) in job.requests.iter_mut().zip(&job.fingerprints) {
            match batch.append(tx, request, *fingerprint).await {
                Ok(outcome) => answers.push(Ok(outcome)),
                Err(Error::Domain(e)) => {
                    // Those after it were sent on the understanding that it went in.
                    answers.push(Err(e.into()));
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        outcomes.push(answers);
    }
    Ok(outcomes)
}

/// A batch written and committed.
pub(super) struct CommittedBatch {
    pub(super) outcomes: Vec<Vec<Result<AppendOutcome>>>,
    pub(super) nodes: Vec<NodeWrite>,
    pub(super) seen: HashMap<TargetKey, FoundTarget>,
    closed: HashSet<(SessionId, NodeId)>,
    blobs: HashSet<(SessionId, Hash)>,
}

impl CommittedBatch {
    /// What the committed batch found and left is true until something else moves a head.
    pub(super) fn remember(&self, targets: &mut TargetCache, blobs: &mut KnownBlobs) {
        targets.remember(&self.seen, &self.closed);
        blobs.remember(&self.blobs);
    }
}
