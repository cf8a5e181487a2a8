//! The group committer: appends queue for one task, where every one waiting is checked
//! (`batch`) and written in one transaction of the backend's committer connection (`write`),
//! and acknowledged after its COMMIT: a batch shares one durable commit (one fsync on SQLite).
//!
//! The backend chooses where the loop runs (SQLite: a thread of its own over a synchronous
//! connection, so a batch makes no thread hop per statement), and whether a batch is split:
//! on a distributed database (Citus) each transaction holds the appends of one shard, so it
//! commits on one node in one phase; on one PostgreSQL database the batch's sessions are
//! spread over the lanes; either way the transactions run at once, one per lane (connection).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use futures_util::future::join_all;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::idempotency::append_fingerprint;
use super::memory::{KnownBlobs, TargetCache};
use super::planned::NodeInsert;
use super::request::{AppendOutcome, AppendRequest, AppendTarget};
use super::write::{CommittedBatch, write_at_once, write_batch};
use super::{Error, Fault, Result};
use crate::domain::{Hash, NodeId, SessionId};
use crate::store::backend::CommitterConnection;
use crate::store::read::changes::Changes;

/// Appends waiting for the group committer: one, or a stream's run of them written in order
/// until the first that is refused.
pub(super) struct Job {
    pub(super) requests: Vec<AppendRequest>,
    /// With an idempotency key: what a retry must repeat ([`append_fingerprint`]).
    pub(super) fingerprints: Vec<Option<Hash>>,
    reply: oneshot::Sender<Answer>,
}

/// What a job is answered with after the COMMIT.
pub(super) struct Answer {
    /// The outcome of each request up to and including the first refused (or the batch's
    /// failure, as the first's): those after it are not written.
    pub(super) outcomes: Vec<Result<AppendOutcome>>,
    /// The requests, given back as checked (result names filled in): with `written`, what the
    /// caller needs to remember the new nodes without reading them.
    pub(super) requests: Vec<AppendRequest>,
    /// The nodes the batch wrote, by id.
    pub(super) written: Arc<HashMap<NodeId, NodeInsert>>,
}

impl Job {
    /// Appends for the committer, fingerprinted here, in the caller's task: hashing the
    /// content is work the committer's one thread need not do.
    pub(super) fn new(requests: Vec<AppendRequest>, reply: oneshot::Sender<Answer>) -> Self {
        // As sent: the checks fill in result names later.
        let fingerprints = requests
            .iter()
            .map(|request| {
                request
                    .idempotency_key
                    .as_ref()
                    .map(|_| append_fingerprint(request))
            })
            .collect();
        Self {
            requests,
            fingerprints,
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

/// What the committer counts, for tests and operators (also exported as metrics).
#[derive(Debug, Default)]
pub struct CommitStats {
    batches: AtomicU64,
    inline: AtomicU64,
    pub(super) at_once: AtomicU64,
    pub(super) transactions: AtomicU64,
    pub(super) conflict_retries: AtomicU64,
}

/// [`CommitStats`] read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitCounts {
    /// Batches taken off the inbox.
    pub batches: u64,
    /// Of those, batches an append committed on its own task, finding the committer idle.
    pub inline: u64,
    /// Transactions written by one statement, planned from remembered state without a read.
    pub at_once: u64,
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
            inline: self.inline.load(Ordering::Relaxed),
            at_once: self.at_once.load(Ordering::Relaxed),
            transactions: self.transactions.load(Ordering::Relaxed),
            conflict_retries: self.conflict_retries.load(Ordering::Relaxed),
        }
    }
}

/// Sessions whose shard is remembered at most; past that the map starts over.
const KNOWN_SHARDS: usize = 100_000;

/// The committer's connections (lanes) and what it remembers. One batch at a time holds it:
/// the committer's loop, or an append that found the committer idle and commits inline.
pub(super) struct Core {
    lanes: Vec<Box<dyn CommitterConnection>>,
    targets: TargetCache,
    blobs: KnownBlobs,
    /// Each session's node and shard (see `CommitterConnection::shards`).
    shards: HashMap<SessionId, (i64, i64)>,
    changes: Changes,
    stats: Arc<CommitStats>,
    closed: bool,
    /// Jobs the last batch held: more than one means appends are arriving together.
    last_batch: Arc<AtomicUsize>,
}

/// Where appends go: the committer's inbox, and, where the backend allows it, the committer's
/// core itself for an append that finds nothing queued.
#[derive(Clone)]
pub(in crate::store) struct CommitQueue {
    inbox: mpsc::Sender<Message>,
    /// Set where a batch never suspends once it has begun (SQLite's synchronous connection):
    /// a caller that goes away cannot leave a transaction half-done, so an idle committer's
    /// work is done on the caller's task, without the two thread wake-ups of a hand-off.
    inline: bool,
    core: Arc<Mutex<Core>>,
    /// Appends submitted and not yet answered.
    in_flight: Arc<AtomicUsize>,
    /// As [`Core::last_batch`], readable without the core.
    last_batch: Arc<AtomicUsize>,
}

/// Counts an append in flight until it is answered, or its caller goes away.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl CommitQueue {
    /// The queue over `lanes` (the connections shards' transactions run on at once) and the
    /// committer's loop, for the backend to run where it likes; `inline` as on
    /// [`CommitQueue::inline`].
    pub(in crate::store) fn start(
        lanes: Vec<Box<dyn CommitterConnection>>,
        changes: Changes,
        stats: Arc<CommitStats>,
        inline: bool,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        assert!(!lanes.is_empty(), "the committer has a connection");
        let last_batch = Arc::new(AtomicUsize::new(0));
        let core = Arc::new(Mutex::new(Core {
            lanes,
            targets: TargetCache::default(),
            blobs: KnownBlobs::default(),
            shards: HashMap::new(),
            changes,
            stats,
            closed: false,
            last_batch: Arc::clone(&last_batch),
        }));
        let (inbox, receiver) = mpsc::channel(MAX_BATCH * 4);
        let queue = Self {
            inbox,
            inline,
            core: Arc::clone(&core),
            in_flight: Arc::default(),
            last_batch,
        };
        (queue, group_committer(core, receiver))
    }

    /// Checks and writes `requests` in order, stopping at the first refused; answers after the
    /// COMMIT with the outcome of each up to and including that one.
    pub(super) async fn submit(&self, requests: Vec<AppendRequest>) -> Result<Answer> {
        let (reply, answer) = oneshot::channel();
        let job = Job::new(requests, reply);
        let alone = self.in_flight.fetch_add(1, Ordering::Relaxed) == 0;
        let _counted = InFlight(&self.in_flight);
        // No other append in flight, none queued, no batch in hand, and the last batch was a
        // lone append: commit here. Under load (the last batch held several) the committer's
        // loop takes them, so its fsync leaves the runtime's threads to the callers, which
        // meanwhile queue the next batch: an inline commit there would hold a runtime thread
        // through an fsync for one append.
        let idle = alone
            && self.last_batch.load(Ordering::Relaxed) <= 1
            && self.inbox.capacity() == self.inbox.max_capacity();
        match (self.inline && idle).then(|| self.core.try_lock()) {
            Some(Ok(mut core)) if !core.closed => {
                core.stats.inline.fetch_add(1, Ordering::Relaxed);
                core.run(vec![job]).await;
            }
            _ => self
                .inbox
                .send(Message::Append(job))
                .await
                .map_err(|_| Error::Closed)?,
        }
        answer.await.map_err(|_| Error::Closed)
    }

    /// Whether another connection or process has committed since this was last asked, as
    /// the committer's connection tells without a read (`None`: it cannot tell, or is busy
    /// with a batch, so assume it has).
    pub(in crate::store) fn others_committed(&self) -> Option<bool> {
        let mut core = self.core.try_lock().ok()?;
        if core.closed {
            return None;
        }
        core.lanes.first_mut()?.others_committed()
    }

    /// Stops the committer after the batch in hand and closes its connections.
    pub(in crate::store) async fn close(&self) {
        let (reply, closed) = oneshot::channel();
        if self.inbox.send(Message::Close(reply)).await.is_ok() {
            let _ = closed.await;
        }
    }
}

/// Takes appends off the inbox and writes every one waiting in one batch; stops when told to
/// close or when every sender is gone.
async fn group_committer(core: Arc<Mutex<Core>>, mut inbox: mpsc::Receiver<Message>) {
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
        if !batch.is_empty() {
            core.lock().await.run(batch).await;
        }
    }
    let mut core = core.lock().await;
    core.closed = true;
    for conn in core.lanes.drain(..) {
        conn.close().await;
    }
    if let Some(reply) = closing {
        let _ = reply.send(());
    }
}

/// One node's share of a batch: its jobs, in the order they came in, each with its session's
/// shard where it is known. It is written by one call when it can be written at once, else
/// as one transaction per shard (one for all where every job's shard is the same).
struct Group {
    jobs: Vec<Job>,
    shards: Vec<Option<i64>>,
}

impl Group {
    /// The group's jobs split by shard, in order within each.
    fn by_shard(self) -> Vec<Vec<Job>> {
        let mut parts: Vec<(Option<i64>, Vec<Job>)> = Vec::new();
        for (job, shard) in self.jobs.into_iter().zip(self.shards) {
            match parts.iter_mut().find(|(s, _)| *s == shard) {
                Some((_, jobs)) => jobs.push(job),
                None => parts.push((shard, vec![job])),
            }
        }
        parts.into_iter().map(|(_, jobs)| jobs).collect()
    }

    fn one_shard(&self) -> bool {
        self.shards.windows(2).all(|w| w[0] == w[1])
    }
}

impl Core {
    /// Writes `batch` in one transaction per shard (one in all on an undistributed database),
    /// then one COMMIT each, and answers every job.
    async fn run(&mut self, batch: Vec<Job>) {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.last_batch.store(batch.len(), Ordering::Relaxed);
        let groups = split_by_shard(&mut *self.lanes[0], &mut self.shards, batch).await;
        // Each lane writes its share of the groups one after another; the lanes run at once.
        let lane_count = self.lanes.len();
        let mut shares: Vec<Vec<Group>> = (0..lane_count).map(|_| Vec::new()).collect();
        for (i, group) in groups.into_iter().enumerate() {
            shares[i % lane_count].push(group);
        }
        let (targets, blobs, stats) = (&self.targets, &self.blobs, &*self.stats);
        let written = join_all(
            self.lanes
                .iter_mut()
                .zip(shares)
                .map(|(conn, share)| async move {
                    let mut done = Vec::with_capacity(share.len());
                    for mut group in share {
                        if !group.one_shard() {
                            // Several shards of one node: one call for all where it can be
                            // written at once, else a transaction per shard, so that none
                            // commits in two phases.
                            match write_at_once(&mut **conn, &mut group.jobs, targets, blobs, stats)
                                .await
                            {
                                Ok(Some(written)) => done.push((group.jobs, Ok(written))),
                                Ok(None) => {
                                    for mut jobs in group.by_shard() {
                                        let result = write_batch(
                                            &mut **conn,
                                            &mut jobs,
                                            targets,
                                            blobs,
                                            stats,
                                        )
                                        .await;
                                        done.push((jobs, result));
                                    }
                                }
                                Err(e) => done.push((group.jobs, Err(e))),
                            }
                            continue;
                        }
                        let result =
                            write_batch(&mut **conn, &mut group.jobs, targets, blobs, stats).await;
                        done.push((group.jobs, result));
                    }
                    done
                }),
        )
        .await;
        for (jobs, result) in written.into_iter().flatten() {
            answer(
                &self.changes,
                &mut self.targets,
                &mut self.blobs,
                jobs,
                result,
            );
        }
    }
}

/// The batch as groups: one per node where the database is distributed (a session's appends
/// stay together and in order), else one.
async fn split_by_shard(
    conn: &mut dyn CommitterConnection,
    shards: &mut HashMap<SessionId, (i64, i64)>,
    batch: Vec<Job>,
) -> Vec<Group> {
    if !conn.sharded() {
        let shards = vec![None; batch.len()];
        return vec![Group {
            jobs: batch,
            shards,
        }];
    }
    // A job's requests are of one session (a stream's); its first names it.
    let session_of = |job: &Job| job.requests.first().map(|r| r.session.id());
    let mut unknown: Vec<SessionId> = batch
        .iter()
        .filter_map(session_of)
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
    let mut by_node: Vec<(Option<Transaction>, Group)> = Vec::new();
    for job in batch {
        let place = session_of(&job).and_then(|session| shards.get(&session).copied());
        let key = session_of(&job).map(|session| match place {
            Some((node, _)) => Transaction::Node(node),
            None => Transaction::Session(session),
        });
        let shard = place.map(|(_, shard)| shard);
        match by_node.iter_mut().find(|(k, _)| *k == key) {
            Some((_, group)) => {
                group.jobs.push(job);
                group.shards.push(shard);
            }
            None => by_node.push((
                key,
                Group {
                    jobs: vec![job],
                    shards: vec![shard],
                },
            )),
        }
    }
    by_node.into_iter().map(|(_, group)| group).collect()
}

/// What a batch's transaction holds the appends of.
#[derive(PartialEq, Eq)]
enum Transaction {
    Node(i64),
    /// A session whose shard is not known.
    Session(SessionId),
}

/// Answers the jobs of one transaction (after its COMMIT, or with why it failed) and
/// remembers what it committed.
fn answer(
    changes: &Changes,
    targets: &mut TargetCache,
    blobs: &mut KnownBlobs,
    jobs: Vec<Job>,
    result: Result<CommittedBatch>,
) {
    match result {
        Ok(done) => {
            done.remember(targets, blobs);
            // After the COMMIT: a watcher woken now reads the batch, and a render finds the
            // heads it moved.
            let pinned: HashSet<SessionId> = jobs
                .iter()
                .flat_map(|job| &job.requests)
                .filter(|request| !request.pinned.is_empty())
                .map(|request| request.session.id())
                .collect();
            let mut moved: HashMap<SessionId, Vec<_>> = HashMap::new();
            for ((session, target), seen) in &done.seen {
                let branches = moved.entry(*session).or_default();
                if let AppendTarget::Branch(branch) = target {
                    branches.push((branch, seen.found_head, seen.state.head));
                }
            }
            for (session, branches) in moved {
                changes.appended(session, &branches, pinned.contains(&session));
            }
            let written: Arc<HashMap<NodeId, NodeInsert>> = Arc::new(
                done.nodes
                    .into_iter()
                    .map(|node| (node.insert.id, node.insert))
                    .collect(),
            );
            for (job, outcomes) in jobs.into_iter().zip(done.outcomes) {
                // The caller may have gone (cancelled); its append is durable all the same,
                // and a retry with its idempotency key returns this answer.
                let _ = job.reply.send(Answer {
                    outcomes,
                    requests: job.requests,
                    written: Arc::clone(&written),
                });
            }
        }
        Err(e) => {
            // Kept with each answer: a full disk and a busy lock are told apart from a defect.
            // A rolled-back batch changed nothing the caches remember.
            let fault = e.fault().unwrap_or(Fault::Internal);
            let detail = e.to_string();
            tracing::error!(error = %detail, appends = jobs.len(), "group commit failed");
            for job in jobs {
                let _ = job.reply.send(Answer {
                    outcomes: vec![Err(Error::Batch {
                        fault,
                        detail: detail.clone(),
                    })],
                    requests: job.requests,
                    written: Arc::default(),
                });
            }
        }
    }
}
