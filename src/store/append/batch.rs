//! The checks an append passes, apart from how rows are stored: a batch reads its targets
//! through the backend's `AppendTx`, checks each append against the state it found and left them in (head, hashes,
//! pairing state), and plans the rows it writes; and the fingerprint an idempotent retry must
//! repeat.

use std::collections::{HashMap, HashSet};

use super::memory::{KnownBlobs, TargetCache, TargetKey, TargetState};
use super::planned::{BatchRows, IdempotencyRow, NodeInsert};
use super::request::{AppendOutcome, AppendRequest, AppendTarget};
use super::{Error, Result};
use crate::domain::{
    self, Admit, ChainTail, ClosedChain, Hash, NodeContent, NodeId, SessionId, node_hash,
};
use crate::store::backend::AppendTx;
use crate::store::form::body::Body;

/// A target as this batch found or left it.
#[derive(Clone)]
pub(in crate::store) struct FoundTarget {
    pub(super) state: TargetState,
    /// A function target closed when it was read.
    pub(super) closed: bool,
    /// The head as the batch found it, before any of its appends.
    pub(super) found_head: Option<NodeId>,
}

/// One batch being checked: the targets as it found and left them, and the rows it will
/// write. Also what an import writes its runs with.
pub(in crate::store) struct Batch<'c> {
    targets: &'c TargetCache,
    blobs: &'c KnownBlobs,
    now: i64,
    pub(in crate::store) seen: HashMap<TargetKey, FoundTarget>,
    /// Idempotency records this batch writes.
    keys: HashMap<(SessionId, String), (Hash, AppendOutcome)>,
    /// Functions this batch closes.
    pub(super) closed: HashSet<(SessionId, NodeId)>,
    pub(super) pending: BatchRows,
    /// Takes a remembered target's state without reading its head: the write then checks
    /// the head it replaces ([`crate::store::backend::CommitterConnection::write_at_once`]).
    trusted: bool,
}

static NO_TARGETS: std::sync::LazyLock<TargetCache> = std::sync::LazyLock::new(Default::default);
static NO_BLOBS: std::sync::LazyLock<KnownBlobs> = std::sync::LazyLock::new(Default::default);

impl<'c> Batch<'c> {
    pub(super) fn new(targets: &'c TargetCache, blobs: &'c KnownBlobs, now: i64) -> Self {
        Self {
            targets,
            blobs,
            now,
            seen: HashMap::new(),
            keys: HashMap::new(),
            closed: HashSet::new(),
            pending: BatchRows::default(),
            trusted: false,
        }
    }

    /// This batch, taking remembered targets as they were left without reading them.
    pub(super) fn trusting(self) -> Self {
        Self {
            trusted: true,
            ..self
        }
    }

    /// A batch that remembers nothing and reads everything.
    pub(in crate::store) fn standalone(now: i64) -> Batch<'static> {
        Batch::new(&NO_TARGETS, &NO_BLOBS, now)
    }

    /// Reads, and where the engine locks rows thereby locks, the targets of `requests` in one
    /// fixed order (by session, then branch or function), before any is checked: two
    /// transactions that take the same rows in the same order queue rather than deadlock.
    /// A target that is not there is left to its append to report. (A function that a result
    /// closes is found only by checking the append, and locked then.)
    pub(super) async fn lock_targets<'r>(
        &mut self,
        tx: &mut (impl AppendTx + ?Sized),
        requests: impl IntoIterator<Item = &'r AppendRequest>,
    ) -> Result<()> {
        let mut keys: Vec<TargetKey> = requests
            .into_iter()
            .map(|r| (r.session.id(), r.target.clone()))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.len() < 2 {
            return Ok(());
        }
        for key in &keys {
            match self.state(tx, key).await {
                Ok(_) | Err(Error::Domain(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Checks one append (whose fingerprint is `request_hash` when it has an idempotency key)
    /// against the state this batch has reached and plans its writes.
    pub(super) async fn append(
        &mut self,
        tx: &mut (impl AppendTx + ?Sized),
        request: &mut AppendRequest,
        request_hash: Option<Hash>,
    ) -> Result<AppendOutcome> {
        let session = request.session.id();
        if let (Some(key), Some(hash)) = (&request.idempotency_key, &request_hash) {
            let previous = match self.keys.get(&(session, key.clone())) {
                Some((stored, outcome)) => Some((*stored, outcome.clone())),
                None => tx.idempotency_record(session, key).await?,
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
        tx: &mut (impl AppendTx + ?Sized),
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
            return Err(domain::Error::head_moved(head, expected).into());
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
                    self.pending.closes.push((session, id, function));
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
                self.pending
                    .function_heads
                    .insert((session, *function), new_head);
            }
        }
        self.seen.insert(
            key,
            FoundTarget {
                state: TargetState {
                    head: head_id,
                    head_hash: parent_hash,
                    scope_hash,
                    tail,
                },
                closed: false,
                found_head: found.found_head,
            },
        );
        Ok(written)
    }

    /// The state of `key` as this batch stands: as it left or found it, else the remembered
    /// state if the stored head is still its head, else read.
    async fn state(
        &mut self,
        tx: &mut (impl AppendTx + ?Sized),
        key: &TargetKey,
    ) -> Result<FoundTarget> {
        if let Some(seen) = self.seen.get(key) {
            return Ok(seen.clone());
        }
        if self.trusted
            && let Some(state) = self.targets.0.get(key)
        {
            // Only open functions are remembered.
            let seen = FoundTarget {
                found_head: state.head,
                state: state.clone(),
                closed: false,
            };
            self.seen.insert(key.clone(), seen.clone());
            return Ok(seen);
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
        let seen = FoundTarget {
            state,
            closed,
            found_head: head,
        };
        self.seen.insert(key.clone(), seen.clone());
        Ok(seen)
    }

    /// What a result closing `function` records; its chain must have no pending calls.
    async fn closing_chain(
        &mut self,
        tx: &mut (impl AppendTx + ?Sized),
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
    pub(in crate::store) async fn write(
        &mut self,
        tx: &mut (impl AppendTx + ?Sized),
        session: SessionId,
        target: &AppendTarget,
        nodes: &mut [NodeContent],
        field_of: &(dyn Fn(usize) -> String + Sync),
    ) -> Result<Vec<(NodeId, Hash)>> {
        let written = self
            .nodes(tx, session, target, None, nodes, field_of)
            .await?;
        tx.write_rows(&self.pending).await?;
        self.pending = BatchRows::default();
        Ok(written)
    }
}

/// The state of `target` at the stored `head`: the hashes new nodes chain from and the chain's
/// pairing state.
async fn read_state(
    tx: &mut (impl AppendTx + ?Sized),
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
    tx: &mut (impl AppendTx + ?Sized),
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
