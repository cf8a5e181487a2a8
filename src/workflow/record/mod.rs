//! Recording a request: which session it belongs to, how much of its history is stored
//! already (found by node hash), and where the rest goes (the branch whose head it extends, or
//! a new branch forked at the last shared node).

mod compacted;
mod prefix;
mod sessions;
mod subagent;

use crate::domain::{self, BranchName, Hash, NodeContent, NodeId, Tenant};
use crate::provider::agents::{continued_summary, is_codex_compaction};
use crate::provider::conversation::Conversation;
use crate::store::{self, AppendRequest, AppendTarget, Scoped, Store};
use crate::workflow::Workflows;

mod answer;
mod call;
mod preview;

use compacted::{codex_window, continuation};
use prefix::{Against, Fork, chain_hashes_after, from_stored_prefix};
use sessions::{Found, Key, born, found, open, session_key};
use subagent::subagent;

pub use call::{Call, ConversationKey, Known};
pub use prefix::chain_hashes;
pub use preview::extended;
pub use sessions::{KEY_METADATA, SessionKeys, opening_key, peek};

/// Where a recorded request went: the branch (and, for a sub-agent's conversation, the
/// function whose chain holds it) and the head after the request's messages, which the answer
/// is appended to.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub session: Scoped,
    pub branch: BranchName,
    /// The function (sub-agent) whose chain the request is, and its call node's hash.
    pub function: Option<(NodeId, Hash)>,
    /// The head and its hash (`None`: an empty branch or chain).
    pub head: Option<(NodeId, Hash)>,
    /// The request ends before the branch's head (a retry of a call answered already): it is
    /// rendered at `head`, and its answer goes after `head`.
    pub behind: bool,
    /// What the model has read of the rendered path: the history up to where this request's
    /// new messages begin (the stored node its prefix reached).
    pub seen: crate::render::Seen,
    /// The agent's own summary to lay over the history it replaced, when this request is the
    /// first of a compacted conversation.
    pub agent_summary: Option<AgentSummary>,
}

/// An agent's summary of a branch's top-level history from `from` through `to`.
#[derive(Debug, Clone)]
pub struct AgentSummary {
    pub text: String,
    pub from: NodeId,
    pub to: NodeId,
    /// Whose summary, and so how it renders (`agent_compaction::CLAUDE_CODE_MODEL`, `CODEX_MODEL`).
    pub model: &'static str,
}

impl Recorded {
    pub fn target(&self) -> AppendTarget {
        match self.function {
            Some((id, _)) => AppendTarget::Function(id),
            None => AppendTarget::Branch(self.branch.clone()),
        }
    }
}

/// Why a request was not recorded; it is forwarded as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unrecorded(pub &'static str);

/// Said by a step that lost a race with another request: match again.
const RETRY: &str = "sessions kept changing";

/// How many times a request is matched again when another request moved its branch between
/// the match and the append.
const ATTEMPTS: usize = 4;

/// What to append where.
struct Plan {
    branch: BranchName,
    function: Option<(NodeId, Hash)>,
    expected: Option<(NodeId, Hash)>,
    rest: Vec<NodeContent>,
    behind: bool,
    agent_summary: Option<AgentSummary>,
}

/// A request's session found or made, with what finding it read of the request.
struct Opened<'c> {
    /// The request's node contents, checked, and their chain hashes.
    contents: Vec<&'c NodeContent>,
    hashes: Vec<Hash>,
    /// The key of the conversation's opening, and the key its session was found by.
    opening: String,
    key: Key,
    session: Scoped,
    /// The session is not made yet (only [`locate`] leaves it so): the key it will be made for.
    unborn: Option<String>,
}

/// Checks `conv` and finds its session: where [`record`] and [`locate`] both begin. `make`:
/// a session the request's key names none of is made now; else it is only named
/// ([`Opened::unborn`]).
async fn opened<'c>(
    w: &Workflows,
    call: &Call,
    conv: &'c Conversation,
    make: bool,
) -> Result<Opened<'c>, Unrecorded> {
    let (store, tenant) = (&w.store, &call.tenant);
    let known = call
        .known
        .as_ref()
        .filter(|k| k.items <= conv.items.len() && k.items <= k.hashes.len());
    let contents = checked(conv, call.max_part_bytes, known.map_or(0, |k| k.items))?;
    let hashes = match known {
        Some(k) => chain_hashes_after(&k.hashes[..k.items], &contents[k.items..]),
        None => chain_hashes(&contents, None),
    };
    #[cfg(debug_assertions)]
    assert_eq!(
        hashes,
        chain_hashes(&contents, None),
        "the known items' hashes are the request's"
    );
    let opening = opening_key(&conv.opening);
    let key = session_key(store, tenant, call.named.as_deref(), conv, &opening).await;
    let (session, unborn) = if make {
        (open(store, &w.session_keys, tenant, &key).await?, None)
    } else {
        match found(store, &w.session_keys, tenant, &key).await? {
            Found::Open(session) => (session, None),
            Found::Unborn { session, name } => (session, Some(name)),
        }
    };
    Ok(Opened {
        contents,
        hashes,
        opening,
        key,
        session,
        unborn,
    })
}

/// Where a request would be recorded, found without writing but for making its session: the
/// branch it extends (or the fork it would make), the stored node its history reaches, and what
/// is new. `None` where recording itself decides more than that (a sub-agent's first call, an
/// agent's compaction, a conversation of its own): that request is recorded before it is
/// forwarded.
async fn locate(
    w: &Workflows,
    call: &Call,
    conv: &Conversation,
) -> Result<Option<Located>, Unrecorded> {
    let store = &w.store;
    let Opened {
        contents,
        hashes,
        session,
        unborn,
        ..
    } = opened(w, call, conv, false).await?;
    let known = Known {
        items: hashes.len(),
        hashes: hashes.clone().into(),
    };
    let branches = match &unborn {
        // A session not made yet holds an empty main, as a new session does.
        Some(_) => vec![domain::Branch {
            name: BranchName::main(),
            head: None,
            updated_at_ms: 0,
        }],
        None => store.list_branches(session).await.map_err(store_error)?,
    };
    let h = Against::new((store, session), &branches, (&contents, &hashes));
    let plan = match contents.iter().position(|c| is_codex_compaction(c)) {
        Some(c) => match codex_window(&h, c).await? {
            Some(plan) => Some(plan),
            None => return Ok(None),
        },
        None => None,
    };
    let plan = match plan {
        Some(plan) => plan,
        None => match from_stored_prefix(&h, Fork::Name).await? {
            Some(plan) => plan,
            None => match onto_empty_main(&branches, &contents) {
                Some(plan) => plan,
                None => return Ok(None),
            },
        },
    };
    // A background sub-agent's function started by this request: recorded before forwarding,
    // so the sub-agent's first request finds it.
    if plan.agent_summary.is_some()
        || plan.function.is_some()
        || plan
            .rest
            .iter()
            .any(|c| matches!(c, NodeContent::FunctionCall { .. }))
    {
        return Ok(None);
    }
    Ok(Some(Located {
        session,
        unborn,
        known,
        branch: plan.branch,
        expected: plan.expected,
        rest: plan.rest,
        behind: plan.behind,
        lent: 0,
        lost: false,
    }))
}

/// Records a request [`locate`]d before it was forwarded: what it adds is appended where
/// locating found it goes, while that branch's head is still the node it extends; else (another
/// request moved the head, or the fork it needs is not made yet) it is recorded afresh.
async fn record_located(
    w: &Workflows,
    call: &Call,
    conv: &mut Conversation,
    mut located: Located,
) -> Result<Recorded, Unrecorded> {
    if located.lost {
        return Err(Unrecorded("render"));
    }
    located.give_back(conv);
    if let Some(name) = located.unborn.take() {
        located.session = born(
            &w.store,
            &w.session_keys,
            &call.tenant,
            &name,
            located.session,
        )
        .await?;
    }
    if !located.rest.is_empty() {
        let seen = located.seen();
        let request = AppendRequest {
            session: located.session,
            target: AppendTarget::Branch(located.branch.clone()),
            expected_head: Some(located.expected.map(|(id, _)| id)),
            idempotency_key: None,
            nodes: located.rest,
            pinned: Vec::new(),
        };
        if let Ok(outcome) = w.store.append(request).await {
            return Ok(Recorded {
                session: located.session,
                branch: located.branch,
                function: None,
                head: appended(&outcome),
                behind: false,
                seen,
                agent_summary: None,
            });
        }
    }
    record(w, call, conv).await
}

/// Records `conv`: finds or makes its session, appends what it does not hold.
async fn record(w: &Workflows, call: &Call, conv: &Conversation) -> Result<Recorded, Unrecorded> {
    let opened = opened(w, call, conv, true).await?;
    record_in(&w.store, &w.session_keys, &call.tenant, conv, opened).await
}

/// The head an append left, counted in the metrics.
fn appended(outcome: &store::AppendOutcome) -> Option<(NodeId, Hash)> {
    metrics::counter!("ctxd_appended_nodes_total").increment(outcome.node_ids.len() as u64);
    NodeId::parse("head_id", &outcome.head_id)
        .ok()
        .zip(blake3::Hash::from_hex(&outcome.head_hash).ok())
        .map(|(id, hash)| (id, Hash(*hash.as_bytes())))
}

/// A request located but not yet recorded (see [`locate`]).
#[derive(Debug, Clone)]
pub struct Located {
    pub session: Scoped,
    /// The session is not made yet: the key it is made for once the request is recorded (a
    /// request the upstream never answers leaves no session behind, though its answer names
    /// the one it would have made).
    pub unborn: Option<String>,
    /// What the next request of its conversation knows of this one's items.
    pub known: Known,
    pub branch: BranchName,
    /// The stored node the request's history reaches, and its hash.
    pub expected: Option<(NodeId, Hash)>,
    /// What the request adds after it.
    pub rest: Vec<NodeContent>,
    pub behind: bool,
    /// The request's last items whose content was let go while `rest` holds it (see
    /// [`Located::lend`]); given back before the request is recorded.
    pub lent: usize,
    /// What was lent is gone (the render that held it failed).
    pub lost: bool,
}

impl Located {
    /// Lets the request's last items go where `rest` holds the same content, so a large
    /// request's text is held once while it is forwarded.
    pub fn lend(&mut self, conv: &mut Conversation) {
        let n = self.rest.len();
        let Some(from) = conv.items.len().checked_sub(n) else {
            return;
        };
        if n == 0
            || conv.items[from..]
                .iter()
                .zip(&self.rest)
                .any(|(i, r)| i.content != *r)
        {
            return;
        }
        for item in &mut conv.items[from..] {
            item.content = NodeContent::Message {
                role: domain::Role::User,
                parts: Vec::new(),
                tool_calls: Vec::new(),
            };
        }
        self.lent = n;
    }

    /// Gives the lent items their content again.
    fn give_back(&mut self, conv: &mut Conversation) {
        if self.lent == 0 {
            return;
        }
        let from = conv.items.len() - self.lent;
        for (item, content) in conv.items[from..].iter_mut().zip(&self.rest) {
            item.content = content.clone();
        }
        self.lent = 0;
    }

    /// What the model has read: the history up to the node the stored part reaches.
    pub fn seen(&self) -> crate::render::Seen {
        self.expected
            .map_or(crate::render::Seen::Nothing, |(id, _)| {
                crate::render::Seen::Through(id)
            })
    }
}

/// The request's messages as node contents, each storable, the whole pairing on its own.
/// The first `known` were checked with an earlier request.
fn checked(
    conv: &Conversation,
    max_part_bytes: usize,
    known: usize,
) -> Result<Vec<&NodeContent>, Unrecorded> {
    // Borrowed: only what a request adds is copied, when it is recorded.
    let contents: Vec<&NodeContent> = conv.items.iter().map(|i| &i.content).collect();
    for (i, content) in contents.iter().enumerate().skip(known) {
        if content.validate(&format!("messages[{i}]")).is_err() {
            return Err(Unrecorded("a message ctxd cannot store"));
        }
        if content.check_part_sizes("", max_part_bytes).is_err() {
            return Err(Unrecorded("a part over --max-part-bytes"));
        }
    }
    if contents.is_empty() {
        return Err(Unrecorded("no messages"));
    }
    // A history that does not pair on its own (a result for no call) could never be appended:
    // refused before any session is made for it, so none is left behind empty.
    let mut tail = domain::ChainTail::default();
    for (i, content) in contents.iter().enumerate() {
        // Pairing reads roles, calls and result ids, never parts: a copy without them is
        // checked, so the request's text is not copied again on its way upstream.
        let mut content = without_parts(content);
        if tail
            .admit(&format!("messages[{i}]"), NodeId::new(), &mut content)
            .is_err()
        {
            return Err(Unrecorded("pairing"));
        }
    }
    Ok(contents)
}

/// Copies of `contents`: what a request adds, to be stored.
/// The whole request as the first nodes of `main`, when the session holds no node yet.
fn onto_empty_main(branches: &[domain::Branch], contents: &[&NodeContent]) -> Option<Plan> {
    let empty = branches.iter().all(|b| b.head.is_none())
        && branches.iter().any(|b| b.name == BranchName::main());
    empty.then(|| Plan {
        branch: BranchName::main(),
        function: None,
        expected: None,
        rest: owned(contents),
        behind: false,
        agent_summary: None,
    })
}

fn owned(contents: &[&NodeContent]) -> Vec<NodeContent> {
    contents.iter().map(|c| (*c).clone()).collect()
}

/// `content` as pairing reads it: its parts left out.
fn without_parts(content: &NodeContent) -> NodeContent {
    match content {
        NodeContent::Message {
            role, tool_calls, ..
        } => NodeContent::Message {
            role: *role,
            parts: Vec::new(),
            tool_calls: tool_calls.clone(),
        },
        NodeContent::ToolResult {
            call_id,
            name,
            is_error,
            ..
        } => NodeContent::ToolResult {
            call_id: call_id.clone(),
            name: name.clone(),
            parts: Vec::new(),
            is_error: *is_error,
        },
        other => other.clone(),
    }
}

/// [`record`] once the session is open.
async fn record_in(
    store: &Store,
    keys: &SessionKeys,
    tenant: &Tenant,
    conv: &Conversation,
    opened: Opened<'_>,
) -> Result<Recorded, Unrecorded> {
    let Opened {
        contents,
        hashes,
        opening,
        key,
        mut session,
        ..
    } = opened;
    let mut own_session = false;
    for _ in 0..ATTEMPTS {
        let branches = store.list_branches(session).await.map_err(store_error)?;
        let h = Against::new((store, session), &branches, (&contents, &hashes));
        // Codex's compacted window resends old messages under its compaction item: it
        // continues the branch that item answered, never a prefix of the old history.
        let window = match contents.iter().position(|c| is_codex_compaction(c)) {
            Some(c) => codex_window(&h, c).await?,
            None => None,
        };
        let found = match window {
            Some(plan) => Some(plan),
            None => from_stored_prefix(&h, Fork::Create).await?,
        };
        let plan = match found {
            Some(plan) => plan,
            None => {
                if let Some(plan) = onto_empty_main(&branches, &contents) {
                    plan
                } else if let Some(plan) = match continued_summary(conv) {
                    Some((opening, text)) => {
                        let found = (opening, text);
                        continuation(&h, found).await?
                    }
                    None => None,
                } {
                    plan
                } else if let Some(plan) = match subagent(store, session, &contents).await {
                    Err(Unrecorded(RETRY)) => continue,
                    other => other?,
                } {
                    plan
                } else if own_session {
                    return Err(Unrecorded("sessions kept changing"));
                } else {
                    // A conversation that shares nothing with this session and starts no
                    // sub-agent of it: a session of its own, never a fork.
                    let own = match &key {
                        Key::Session(id) => Key::Named(format!("{id}/{opening}")),
                        Key::Named(name) if name.starts_with("opening:") => {
                            return Err(Unrecorded(
                                "a derived session that holds another conversation",
                            ));
                        }
                        Key::Named(name) => Key::Named(format!("{name}/{opening}")),
                    };
                    session = open(store, keys, tenant, &own).await?;
                    own_session = true;
                    continue;
                }
            }
        };
        let seen = plan
            .expected
            .map_or(crate::render::Seen::Nothing, |(id, _)| {
                crate::render::Seen::Through(id)
            });
        if plan.rest.is_empty() {
            return Ok(Recorded {
                session,
                branch: plan.branch,
                function: plan.function,
                head: plan.expected,
                behind: plan.behind,
                seen,
                agent_summary: plan.agent_summary,
            });
        }
        let request = AppendRequest {
            session,
            target: match plan.function {
                Some((id, _)) => AppendTarget::Function(id),
                None => AppendTarget::Branch(plan.branch.clone()),
            },
            expected_head: Some(plan.expected.map(|(id, _)| id)),
            idempotency_key: None,
            nodes: plan.rest,
            pinned: Vec::new(),
        };
        match store.append(request).await {
            Ok(outcome) => {
                let head = appended(&outcome);
                return Ok(Recorded {
                    session,
                    branch: plan.branch,
                    function: plan.function,
                    head,
                    behind: false,
                    seen,
                    agent_summary: plan.agent_summary,
                });
            }
            Err(store::Error::Domain(domain::Error::Aborted(_))) => continue,
            Err(store::Error::Domain(
                domain::Error::InvalidArgument { .. } | domain::Error::FailedPrecondition(_),
            )) => return Err(Unrecorded("pairing")),
            Err(e) => return Err(store_error(e)),
        }
    }
    Err(Unrecorded("sessions kept changing"))
}

fn store_error(e: store::Error) -> Unrecorded {
    tracing::warn!(error = %e, "gateway: the store refused a request's recording");
    Unrecorded("store")
}
