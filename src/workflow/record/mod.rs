//! Recording a request: which session it belongs to, how much of its history is stored
//! already (found by node hash), and where the rest goes (the branch whose head it extends, or
//! a new branch forked at the last shared node).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::domain::{
    self, BranchName, Hash, NodeContent, NodeId, Part, SessionId, Tenant, node_hash,
};
use crate::provider::agents::{
    CLAUDE_CODE_MODEL, CODEX_MODEL, CODEX_TEXT, continued_summary, ends_on_summary_answer,
    is_agent_summary_of, is_codex_compaction, is_codex_trigger,
};
use crate::provider::conversation::Conversation;
use crate::store::{self, AppendRequest, AppendTarget, PathTarget, Scoped, Store};

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

/// The session key stored in a gateway session's metadata.
pub const KEY_METADATA: &str = "ctxd.gateway.key";

/// The tools agents start a sub-agent with (Claude Code's, old and new): a conversation that
/// opens with the prompt of a pending call of one is that call's function.
const AGENT_TOOLS: [&str; 2] = ["Task", "Agent"];

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

/// Records `conv` for `tenant`: finds or makes its session, appends what it does not hold.
pub async fn record(
    store: &Store,
    keys: &SessionKeys,
    tenant: &Tenant,
    named: Option<&str>,
    conv: &Conversation,
    max_part_bytes: usize,
) -> Result<Recorded, Unrecorded> {
    let contents = checked(conv, max_part_bytes)?;
    let hashes = chain_hashes(&contents, None);
    let opening = opening_key(&conv.opening);
    let key = session_key(store, tenant, named, conv, &opening).await;
    let session = open(store, keys, tenant, &key).await?;
    record_in(
        store, keys, tenant, conv, contents, hashes, opening, key, session,
    )
    .await
}

/// Where a request would be recorded, found without writing but for making its session: the
/// branch it extends (or the fork it would make), the stored node its history reaches, and what
/// is new. `None` where recording itself decides more than that (a sub-agent's first call, an
/// agent's compaction, a conversation of its own): that request is recorded before it is
/// forwarded.
pub async fn locate(
    store: &Store,
    keys: &SessionKeys,
    tenant: &Tenant,
    named: Option<&str>,
    conv: &Conversation,
    max_part_bytes: usize,
) -> Result<Option<Located>, Unrecorded> {
    let contents = checked(conv, max_part_bytes)?;
    let hashes = chain_hashes(&contents, None);
    let opening = opening_key(&conv.opening);
    let key = session_key(store, tenant, named, conv, &opening).await;
    let session = open(store, keys, tenant, &key).await?;
    let branches = store.list_branches(session).await.map_err(store_error)?;
    let plan = match contents.iter().position(|c| is_codex_compaction(c)) {
        Some(c) => match codex_window(store, session, &branches, &contents, &hashes, c).await? {
            Some(plan) => Some(plan),
            None => return Ok(None),
        },
        None => None,
    };
    let plan = match plan {
        Some(plan) => plan,
        None => match prefix_from_heads(store, session, &branches, &hashes).await? {
            Some((k, node)) => {
                extend_as(
                    store,
                    session,
                    &branches,
                    node,
                    &contents,
                    &hashes,
                    k + 1,
                    Fork::Name,
                )
                .await?
            }
            None if branches.iter().all(|b| b.head.is_none())
                && branches.iter().any(|b| b.name == BranchName::main()) =>
            {
                Plan {
                    branch: BranchName::main(),
                    function: None,
                    expected: None,
                    rest: owned(&contents),
                    behind: false,
                    agent_summary: None,
                }
            }
            None => return Ok(None),
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
pub async fn record_located(
    store: &Store,
    keys: &SessionKeys,
    tenant: &Tenant,
    named: Option<&str>,
    conv: &mut Conversation,
    max_part_bytes: usize,
    mut located: Located,
) -> Result<Recorded, Unrecorded> {
    if located.lost {
        return Err(Unrecorded("render"));
    }
    located.give_back(conv);
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
        if let Ok(outcome) = store.append(request).await {
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
    record(store, keys, tenant, named, conv, max_part_bytes).await
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
fn checked(conv: &Conversation, max_part_bytes: usize) -> Result<Vec<&NodeContent>, Unrecorded> {
    // Borrowed: only what a request adds is copied, when it is recorded.
    let contents: Vec<&NodeContent> = conv.items.iter().map(|i| &i.content).collect();
    for (i, content) in contents.iter().enumerate() {
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

/// How the request names its session: a header, the agent's own session id, or its opening.
async fn session_key(
    store: &Store,
    tenant: &Tenant,
    named: Option<&str>,
    conv: &Conversation,
    opening: &str,
) -> Key {
    match named {
        Some(name) => match SessionId::parse("x-ctxd-session", name) {
            Ok(id) if store.scope(tenant, id).await.is_ok() => Key::Session(id),
            _ => Key::Named(name.to_owned()),
        },
        None => match &conv.client_session {
            Some(id) => Key::Named(format!("agent:{id}")),
            None => Key::Named(format!("opening:{opening}")),
        },
    }
}

/// [`record`] once the session is open.
#[allow(clippy::too_many_arguments)]
async fn record_in(
    store: &Store,
    keys: &SessionKeys,
    tenant: &Tenant,
    conv: &Conversation,
    contents: Vec<&NodeContent>,
    hashes: Vec<Hash>,
    opening: String,
    key: Key,
    session: Scoped,
) -> Result<Recorded, Unrecorded> {
    let mut session = session;
    let mut own_session = false;
    for _ in 0..ATTEMPTS {
        let branches = store.list_branches(session).await.map_err(store_error)?;
        // Codex's compacted window resends old messages under its compaction item: it
        // continues the branch that item answered, never a prefix of the old history.
        let window = match contents.iter().position(|c| is_codex_compaction(c)) {
            Some(c) => codex_window(store, session, &branches, &contents, &hashes, c).await?,
            None => None,
        };
        let found = match window {
            Some(plan) => Ok(plan),
            None => Err(prefix_from_heads(store, session, &branches, &hashes).await?),
        };
        let plan = match found {
            Ok(plan) => plan,
            Err(Some((k, node))) => {
                extend(store, session, &branches, node, &contents, &hashes, k + 1).await?
            }
            Err(None) => {
                if branches.iter().all(|b| b.head.is_none())
                    && branches.iter().any(|b| b.name == BranchName::main())
                {
                    Plan {
                        branch: BranchName::main(),
                        function: None,
                        expected: None,
                        rest: owned(&contents),
                        behind: false,
                        agent_summary: None,
                    }
                } else if let Some(plan) = match continued_summary(conv) {
                    Some(text) => {
                        continuation(store, session, &branches, &contents, &hashes, text).await?
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

/// Where the request's history goes after its stored prefix ends at `node` (`done` items
/// matched by hash). The branches through `node` are read on: a sub-agent's call and result
/// are stored as a function (its call node, then its result), which the client resends as a
/// tool result, so the stored path and the request are compared node by node from there. The
/// request extends the branch that holds most of it; where it leaves a branch before its head,
/// a new branch forks at the last shared node, named after the request's history so a retry
/// finds the same one.
#[allow(clippy::too_many_arguments)]
async fn extend_as(
    store: &Store,
    session: Scoped,
    branches: &[domain::Branch],
    node: NodeId,
    contents: &[&NodeContent],
    hashes: &[Hash],
    done: usize,
    forking: Fork,
) -> Result<Plan, Unrecorded> {
    let order = with_heads(branches);
    let mut best: Option<Reach> = None;
    for branch in order {
        let path = store
            .load_path(session, &PathTarget::Branch(branch.name.clone()))
            .await
            .map_err(store_error)?;
        let Some(pos) = path.nodes.iter().position(|n| n.id == node) else {
            continue;
        };
        let (matched, at) = walk(&path.nodes[pos..], &contents[done..]);
        let reached = (path.nodes[pos + at].id, path.nodes[pos + at].hash);
        let at_head = pos + at + 1 == path.nodes.len();
        let better = best
            .as_ref()
            .is_none_or(|b| (done + matched, at_head) > (b.0, b.2));
        if better {
            let calls = Calls::at(&path.nodes[..=pos + at]);
            best = Some((done + matched, reached, at_head, branch.name.clone(), calls));
        }
    }
    let on_branch = best.is_some();
    let Some(fallback) = done.checked_sub(1).and_then(|d| hashes.get(d)) else {
        return Err(Unrecorded("a history that left every branch"));
    };
    let (matched, reached, at_head, branch, calls) = best.unwrap_or((
        done,
        (node, *fallback),
        false,
        BranchName::main(),
        Calls::default(),
    ));
    let rest = calls.stored(&contents[matched..]);
    // A history a branch holds all of, and more (a retry of a call already answered), appends
    // nothing and forks nothing: it renders at its own last node, and an answer equal to the
    // stored one is found there (a different one forks then).
    let behind = !at_head && rest.is_empty() && on_branch;
    let branch = if at_head || behind {
        branch
    } else {
        match forking {
            Fork::Create => fork(store, session, reached.0, branches, hashes).await?,
            Fork::Name => fork_name(reached.0, branches, hashes)?,
        }
    };
    Ok(Plan {
        branch,
        function: None,
        expected: Some(reached),
        rest,
        behind,
        agent_summary: None,
    })
}

/// A conversation that opens with the agent's summary of an earlier one (its compaction): it
/// continues the branch whose history the summary replaced. Where that summary is laid over a
/// branch already, the conversation goes on after what it covers; else the branch that ends on
/// the answer to the agent's summary request (the newest, if several) takes it, and the summary
/// is to be laid over that branch's history. `None`: no such branch.
async fn continuation(
    store: &Store,
    session: Scoped,
    branches: &[domain::Branch],
    contents: &[&NodeContent],
    hashes: &[Hash],
    text: String,
) -> Result<Option<Plan>, Unrecorded> {
    let order = with_heads(branches);
    let mut newest: Option<(i64, BranchName, (NodeId, Hash), NodeId)> = None;
    for branch in order {
        let path = store
            .load_path(session, &PathTarget::Branch(branch.name.clone()))
            .await
            .map_err(store_error)?;
        if let Some(summary) = path
            .summaries
            .iter()
            .rev()
            .find(|s| is_agent_summary_of(s, &text))
        {
            let covered: HashSet<NodeId> = summary.covers.iter().copied().collect();
            if let Some(end) = path.nodes.iter().rposition(|n| covered.contains(&n.id)) {
                let node = path.nodes[end].id;
                return extend(store, session, branches, node, contents, hashes, 1)
                    .await
                    .map(Some);
            }
        }
        if !ends_on_summary_answer(&path.nodes) {
            continue;
        }
        let (Some(head), Some(first)) = (
            path.nodes.last(),
            path.nodes.iter().find(|n| n.function_id.is_none()),
        ) else {
            continue;
        };
        if newest.as_ref().is_none_or(|n| head.created_at_ms > n.0) {
            newest = Some((
                head.created_at_ms,
                branch.name.clone(),
                (head.id, head.hash),
                first.id,
            ));
        }
    }
    Ok(newest.map(|(_, branch, head, first)| Plan {
        branch,
        function: None,
        expected: Some(head),
        rest: owned(&contents[1..]),
        behind: false,
        agent_summary: Some(AgentSummary {
            text,
            from: first,
            to: head.0,
            model: CLAUDE_CODE_MODEL,
        }),
    }))
}

/// A Codex window after a remote compaction: the items Codex kept, then its `compaction` item
/// (at `c`), then what is new. It continues the branch where that item answered a
/// `compaction_trigger`: after the window already laid there (an overlay under the answer, which
/// renders nothing, since the window's own item carries the summary), or, the first time, all of
/// the window after the answer, with that overlay to lay. `None`: no branch holds the answer.
async fn codex_window(
    store: &Store,
    session: Scoped,
    branches: &[domain::Branch],
    contents: &[&NodeContent],
    hashes: &[Hash],
    c: usize,
) -> Result<Option<Plan>, Unrecorded> {
    let order = with_heads(branches);
    for branch in order {
        let path = store
            .load_path(session, &PathTarget::Branch(branch.name.clone()))
            .await
            .map_err(store_error)?;
        for x in 1..path.nodes.len() {
            let node = &path.nodes[x];
            if node.function_id.is_some()
                || node.content != *contents[c]
                || !is_codex_trigger(&path.nodes[x - 1].content)
            {
                continue;
            }
            let laid = path
                .summaries
                .iter()
                .any(|s| s.renders_nothing() && s.covers.contains(&node.id));
            if laid {
                return extend(store, session, branches, node.id, contents, hashes, 0)
                    .await
                    .map(Some);
            }
            if x + 1 < path.nodes.len() {
                continue;
            }
            let Some(first) = path.nodes.iter().find(|n| n.function_id.is_none()) else {
                continue;
            };
            return Ok(Some(Plan {
                branch: branch.name.clone(),
                function: None,
                expected: Some((node.id, node.hash)),
                rest: owned(contents),
                behind: false,
                agent_summary: Some(AgentSummary {
                    text: CODEX_TEXT.to_owned(),
                    from: first.id,
                    to: node.id,
                    model: CODEX_MODEL,
                }),
            }));
        }
    }
    Ok(None)
}

/// The branches that have a head, `main` first, then by name: the order a request's history
/// is looked for in them.
fn with_heads(branches: &[domain::Branch]) -> Vec<&domain::Branch> {
    let mut order: Vec<&domain::Branch> = branches.iter().filter(|b| b.head.is_some()).collect();
    order.sort_by_key(|b| (b.name != BranchName::main(), b.name.as_str().to_owned()));
    order
}

/// [`extend_as`], making the fork it needs.
async fn extend(
    store: &Store,
    session: Scoped,
    branches: &[domain::Branch],
    node: NodeId,
    contents: &[&NodeContent],
    hashes: &[Hash],
    done: usize,
) -> Result<Plan, Unrecorded> {
    extend_as(
        store,
        session,
        branches,
        node,
        contents,
        hashes,
        done,
        Fork::Create,
    )
    .await
}

/// Whether extending a branch makes the fork it needs or only names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fork {
    Create,
    Name,
}

/// How far a request follows one branch: items matched, the stored node reached, whether that
/// is the branch's head, the branch, and the sub-agent calls open there.
type Reach = (usize, (NodeId, Hash), bool, BranchName, Calls);

/// How far `client` follows `stored` (which starts at the last node both share): the client
/// items matched and the index in `stored` of the last stored node matched. A sub-agent's
/// call node is passed over when the client answers its call in the same group, and its
/// result matches the client's tool result of the same call and text.
fn walk(stored: &[std::sync::Arc<domain::Node>], client: &[&NodeContent]) -> (usize, usize) {
    let (mut i, mut j) = (0, 0);
    while i < client.len() && j + 1 < stored.len() {
        let next = &stored[j + 1].content;
        let same = match (next, &client[i]) {
            (NodeContent::FunctionCall { call_id, .. }, _) => {
                // Passed over when a result of this call follows in the client's group.
                if answers_later(client, i, call_id) {
                    j += 1;
                    continue;
                }
                false
            }
            (NodeContent::FunctionResult(r), c) => r.answered_by(c),
            (s, c) => s == *c,
        };
        if !same {
            break;
        }
        i += 1;
        j += 1;
    }
    (i, j)
}

/// Whether the client's items from `i` on answer `call_id` before the next message.
fn answers_later(client: &[&NodeContent], i: usize, call_id: &str) -> bool {
    client[i..]
        .iter()
        .take_while(|c| !matches!(c, NodeContent::Message { .. }))
        .any(|c| matches!(c, NodeContent::ToolResult { call_id: id, .. } if id == call_id))
}

/// The sub-agent calls of a path's latest message: those a function took up and has not closed
/// (call id and function), and those that run in the background.
#[derive(Debug, Default)]
struct Calls {
    open: Vec<(String, NodeId)>,
    background: Vec<AgentCall>,
}

/// A sub-agent call that runs in the background: its id, tool and prompt.
#[derive(Debug, Clone)]
struct AgentCall {
    call_id: String,
    name: String,
    prompt: String,
}

impl Calls {
    fn at(path: &[std::sync::Arc<domain::Node>]) -> Self {
        let Some(start) = path
            .iter()
            .rposition(|n| matches!(n.content, NodeContent::Message { .. }))
        else {
            return Self::default();
        };
        let mut open = Vec::new();
        for n in &path[start..] {
            match &n.content {
                NodeContent::FunctionCall { call_id, .. } => open.push((call_id.clone(), n.id)),
                NodeContent::FunctionResult(r) => open.retain(|(c, _)| *c != r.call_id),
                _ => {}
            }
        }
        Self {
            open,
            background: background_calls(&path[start].content),
        }
    }

    /// What a request adds, as it is stored. A tool result answering a call that a sub-agent's
    /// function took up closes that function; one answering a call that runs in the background
    /// reports its launch, and the function runs on (started here, before the result, when the
    /// sub-agent's first request has not come yet).
    fn stored(mut self, rest: &[&NodeContent]) -> Vec<NodeContent> {
        let mut out = Vec::with_capacity(rest.len());
        for content in rest {
            match content {
                NodeContent::Message { .. } => {
                    self.open.clear();
                    self.background = background_calls(content);
                }
                NodeContent::ToolResult { call_id, .. } => {
                    if let Some(call) = self.background.iter().find(|c| c.call_id == *call_id) {
                        if !self.open.iter().any(|(c, _)| c == call_id) {
                            out.push(NodeContent::FunctionCall {
                                call_id: call.call_id.clone(),
                                name: call.name.clone(),
                                input: call.prompt.clone(),
                                expose: domain::Expose::Io,
                            });
                        }
                        out.push((*content).clone());
                        continue;
                    }
                    out.push(as_function_result(content, &self.open));
                    continue;
                }
                _ => {}
            }
            out.push((*content).clone());
        }
        out
    }
}

/// The calls of an assistant message that start a sub-agent in the background.
fn background_calls(message: &NodeContent) -> Vec<AgentCall> {
    let NodeContent::Message {
        role: domain::Role::Assistant,
        tool_calls,
        ..
    } = message
    else {
        return Vec::new();
    };
    tool_calls
        .iter()
        .filter(|c| AGENT_TOOLS.contains(&c.name.as_str()))
        .filter_map(|c| {
            let arguments = serde_json::from_str::<serde_json::Value>(&c.arguments_json).ok()?;
            let prompt = arguments.get("prompt")?.as_str()?;
            (in_background(&c.name, &arguments) && !prompt.is_empty()).then(|| AgentCall {
                call_id: c.call_id.clone(),
                name: c.name.clone(),
                prompt: prompt.to_owned(),
            })
        })
        .collect()
}

/// A tool result that answers a call a sub-agent's function took up closes that function.
fn as_function_result(content: &NodeContent, open: &[(String, NodeId)]) -> NodeContent {
    match content {
        NodeContent::ToolResult {
            call_id,
            parts,
            is_error,
            ..
        } if open.iter().any(|(c, _)| c == call_id)
            && parts.iter().all(|p| matches!(p, Part::Text(_))) =>
        {
            NodeContent::FunctionResult(domain::FunctionResult {
                call_id: call_id.clone(),
                output: Part::text_of(parts),
                status: if *is_error {
                    domain::FunctionStatus::Error
                } else {
                    domain::FunctionStatus::Completed
                },
                chain: None,
            })
        }
        other => other.clone(),
    }
}

/// A conversation that shares nothing with the session's: when it opens with the prompt of a
/// sub-agent call of the session (pending, or already taken up by a function), it is that
/// call's function, and goes on its chain.
async fn subagent(
    store: &Store,
    session: Scoped,
    contents: &[&NodeContent],
) -> Result<Option<Plan>, Unrecorded> {
    let Some(NodeContent::Message {
        role: domain::Role::User,
        parts,
        ..
    }) = contents.first()
    else {
        return Ok(None);
    };
    let opens_with = |prompt: &str| {
        !prompt.is_empty()
            && (Part::text_of(parts) == prompt
                || parts
                    .iter()
                    .any(|p| matches!(p, Part::Text(t) if t == prompt)))
    };
    let branches = store.list_branches(session).await.map_err(store_error)?;
    let order = with_heads(&branches);
    let mut pending: Option<(BranchName, NodeId, NodeContent)> = None;
    for branch in order {
        let path = store
            .load_path(session, &PathTarget::Branch(branch.name.clone()))
            .await
            .map_err(store_error)?;
        // A function already started for this prompt: the conversation goes on in its chain.
        for n in &path.nodes {
            if let NodeContent::FunctionCall { name, input, .. } = &n.content
                && AGENT_TOOLS.contains(&name.as_str())
                && opens_with(input)
            {
                return in_function(store, session, branch.name.clone(), n, contents)
                    .await
                    .map(Some);
            }
        }
        if pending.is_some() {
            continue;
        }
        // A pending call of the latest assistant message with this prompt.
        let Some(a) = path
            .nodes
            .iter()
            .rposition(|n| matches!(n.content, NodeContent::Message { .. }))
        else {
            continue;
        };
        let NodeContent::Message {
            role: domain::Role::Assistant,
            tool_calls,
            ..
        } = &path.nodes[a].content
        else {
            continue;
        };
        let answered = |id: &str| {
            path.nodes[a + 1..].iter().any(|n| match &n.content {
                NodeContent::ToolResult { call_id, .. }
                | NodeContent::FunctionCall { call_id, .. } => call_id == id,
                NodeContent::FunctionResult(r) => r.call_id == id,
                NodeContent::Message { .. } => false,
            })
        };
        for call in tool_calls {
            let arguments = serde_json::from_str::<serde_json::Value>(&call.arguments_json).ok();
            let prompt = arguments
                .as_ref()
                .and_then(|v| v.get("prompt").and_then(|p| p.as_str()).map(str::to_owned));
            if AGENT_TOOLS.contains(&call.name.as_str())
                && let Some(prompt) = prompt
                && opens_with(&prompt)
                && !answered(&call.call_id)
            {
                let head = path.nodes.last().map(|n| n.id).unwrap_or(path.nodes[a].id);
                let node = NodeContent::FunctionCall {
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    input: prompt,
                    expose: domain::Expose::Io,
                };
                pending = Some((branch.name.clone(), head, node));
                break;
            }
        }
    }
    let Some((branch, head, call)) = pending else {
        return Ok(None);
    };
    let started = store
        .append(AppendRequest {
            session,
            target: AppendTarget::Branch(branch.clone()),
            expected_head: Some(Some(head)),
            idempotency_key: None,
            nodes: vec![call],
            pinned: Vec::new(),
        })
        .await;
    let function = match started {
        Ok(outcome) => {
            NodeId::parse("head_id", &outcome.head_id).map_err(|_| Unrecorded("store"))?
        }
        // Another request moved the branch: match again.
        Err(store::Error::Domain(domain::Error::Aborted(_))) => return Err(Unrecorded(RETRY)),
        Err(store::Error::Domain(_)) => return Ok(None),
        Err(e) => return Err(store_error(e)),
    };
    let node = store
        .get_nodes(session, &[function])
        .await
        .map_err(store_error)?;
    let Some(node) = node.first() else {
        return Err(Unrecorded("store"));
    };
    Ok(Some(Plan {
        branch,
        function: Some((function, node.hash)),
        expected: None,
        rest: owned(contents),
        behind: false,
        agent_summary: None,
    }))
}

/// Whether a sub-agent call runs in the background: Claude Code's `Agent` does unless its call
/// says `run_in_background: false` (its call is answered "launched" at once and the result
/// comes later as a notification, so its function runs on after the tool result that answers
/// its call); the older `Task` never does.
fn in_background(tool: &str, arguments: &serde_json::Value) -> bool {
    tool == "Agent"
        && arguments
            .get("run_in_background")
            .and_then(serde_json::Value::as_bool)
            != Some(false)
}

/// A sub-agent's request whose function exists: what its chain holds of it, and the rest.
async fn in_function(
    store: &Store,
    session: Scoped,
    branch: BranchName,
    call: &domain::Node,
    contents: &[&NodeContent],
) -> Result<Plan, Unrecorded> {
    let hashes = chain_hashes(contents, Some(&call.hash));
    let path = store
        .load_path(session, &PathTarget::Function(call.id))
        .await
        .map_err(store_error)?;
    let head = path
        .nodes
        .last()
        .filter(|n| n.function_id == Some(call.id))
        .map(|n| (n.id, n.hash));
    let stored = stored_prefix(store, session, &hashes).await?;
    let done = stored.map_or(0, |(k, _)| k + 1);
    if stored.map(|(_, n)| n) != head.map(|(id, _)| id) {
        return Err(Unrecorded("a sub-agent's history that left its chain"));
    }
    Ok(Plan {
        branch,
        function: Some((call.id, call.hash)),
        expected: head,
        rest: owned(&contents[done..]),
        behind: false,
        agent_summary: None,
    })
}

/// How a request names its session.
enum Key {
    Session(SessionId),
    Named(String),
}

async fn open(
    store: &Store,
    keys: &SessionKeys,
    tenant: &Tenant,
    key: &Key,
) -> Result<Scoped, Unrecorded> {
    match key {
        Key::Session(id) => store.scope(tenant, *id).await.map_err(store_error),
        Key::Named(name) => {
            // A key names one session for good, unless it is deleted: the cached one is taken
            // after the tenant check (which a deleted session fails).
            if let Some(id) = keys.get(tenant, name) {
                match store.scope(tenant, id).await {
                    Ok(scoped) => return Ok(scoped),
                    Err(_) => keys.forget(tenant, name),
                }
            }
            let metadata = BTreeMap::from([(KEY_METADATA.to_owned(), name.clone())]);
            let scoped = store
                .session_for_key(tenant, format!("ctxd-gateway:{name}"), metadata)
                .await
                .map_err(store_error)?;
            keys.remember(tenant, name, scoped.id());
            Ok(scoped)
        }
    }
}

/// The sessions keys named, remembered: a key's session is read once, not on every call.
#[derive(Default)]
pub struct SessionKeys(std::sync::Mutex<HashMap<(Tenant, String), SessionId>>);

/// Keys remembered at most; past it the memory starts over.
const REMEMBERED_KEYS: usize = 10_000;

impl SessionKeys {
    fn get(&self, tenant: &Tenant, key: &str) -> Option<SessionId> {
        let map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(&(tenant.clone(), key.to_owned())).copied()
    }

    fn remember(&self, tenant: &Tenant, key: &str, id: SessionId) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= REMEMBERED_KEYS {
            map.clear();
        }
        map.insert((tenant.clone(), key.to_owned()), id);
    }

    fn forget(&self, tenant: &Tenant, key: &str) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.remove(&(tenant.clone(), key.to_owned()));
    }
}

fn store_error(e: store::Error) -> Unrecorded {
    tracing::warn!(error = %e, "gateway: the store refused a request's recording");
    Unrecorded("store")
}

/// The key of a conversation known only by its opening.
pub fn opening_key(opening: &str) -> String {
    blake3::hash(opening.as_bytes()).to_hex()[..32].to_owned()
}

/// The hash each node would have as a chain from the root (or, in a function, from its call
/// node `scope`): `hashes[i]` covers items 0..=i.
pub fn chain_hashes(contents: &[&NodeContent], scope: Option<&Hash>) -> Vec<Hash> {
    let mut out: Vec<Hash> = Vec::with_capacity(contents.len());
    for content in contents {
        let parent = out.last().or(scope);
        out.push(node_hash(parent, scope, content));
    }
    out
}

/// The longest stored prefix, found first among the branch heads (an agent's request
/// usually extends one: its newest messages are new, the rest is the head's history), then by
/// the search of [`stored_prefix`]. A head's match is taken once the next message is not
/// stored, so a longer prefix stored off every head is still found.
async fn prefix_from_heads(
    store: &Store,
    session: Scoped,
    branches: &[domain::Branch],
    hashes: &[Hash],
) -> Result<Option<(usize, NodeId)>, Unrecorded> {
    let at: std::collections::HashMap<&Hash, NodeId> = branches
        .iter()
        .filter_map(|b| b.head.as_ref().map(|(id, hash)| (hash, *id)))
        .collect();
    let Some((k, node)) = hashes
        .iter()
        .enumerate()
        .rev()
        .find_map(|(k, h)| at.get(h).map(|id| (k, *id)))
    else {
        return stored_prefix(store, session, hashes).await;
    };
    match hashes.get(k + 1) {
        None => Ok(Some((k, node))),
        Some(next) => match store
            .node_by_hash(session, next)
            .await
            .map_err(store_error)?
        {
            None => Ok(Some((k, node))),
            Some(_) => stored_prefix(store, session, hashes).await,
        },
    }
}

/// The longest stored prefix: its last index and node. Stored prefixes are closed under
/// taking a shorter one (a stored node's parent is stored), so a search from the end, widening,
/// then halving, finds it in a few lookups; a resent history is usually stored but for its
/// last one or two messages.
async fn stored_prefix(
    store: &Store,
    session: Scoped,
    hashes: &[Hash],
) -> Result<Option<(usize, NodeId)>, Unrecorded> {
    let lookup = |i: usize| async move {
        store
            .node_by_hash(session, &hashes[i])
            .await
            .map_err(store_error)
    };
    let n = hashes.len();
    // `hi`: an index known not stored (or n); `lo`: one known stored.
    let mut hi = n;
    let mut lo: Option<(usize, NodeId)> = None;
    let mut step = 1;
    while hi > 0 {
        let probe = hi.saturating_sub(step);
        match lookup(probe).await? {
            Some(id) => {
                lo = Some((probe, id));
                break;
            }
            None => {
                hi = probe;
                step *= 2;
            }
        }
    }
    let Some(mut found) = lo else { return Ok(None) };
    while found.0 + 1 < hi {
        let mid = found.0 + (hi - found.0) / 2;
        match lookup(mid).await? {
            Some(id) => found = (mid, id),
            None => hi = mid,
        }
    }
    Ok(Some(found))
}

/// A new branch at `node`, named after the request's history (`hashes`) so a retry of the same
/// request finds it.
async fn fork(
    store: &Store,
    session: Scoped,
    node: NodeId,
    branches: &[domain::Branch],
    hashes: &[Hash],
) -> Result<BranchName, Unrecorded> {
    for name in fork_names(hashes) {
        let name = name?;
        match store.create_branch(session, name.clone(), Some(node)).await {
            Ok(_) => return Ok(name),
            Err(store::Error::Domain(domain::Error::AlreadyExists(_))) => {
                if branches.iter().all(|b| b.name != name) {
                    // Made meanwhile by a retry of this very request: take it if it is here.
                    let again = store.list_branches(session).await.map_err(store_error)?;
                    if again
                        .iter()
                        .any(|b| b.name == name && b.head.is_some_and(|(h, _)| h == node))
                    {
                        return Ok(name);
                    }
                }
            }
            Err(e) => return Err(store_error(e)),
        }
    }
    Err(Unrecorded("too many forks at one node"))
}

/// The names a fork of the request's history (`hashes`) may take, in the order they are tried.
fn fork_names(hashes: &[Hash]) -> impl Iterator<Item = Result<BranchName, Unrecorded>> {
    let last = hashes.last().map(Hash::to_hex).unwrap_or_default();
    (1..10).map(move |n| {
        let name = match n {
            1 => format!("gw-{}", &last[..12]),
            n => format!("gw-{}-{n}", &last[..12]),
        };
        BranchName::parse("branch", &name).map_err(|_| Unrecorded("branch name"))
    })
}

/// The name [`fork`] would give a new branch at `node` (or has given it, for a retry).
fn fork_name(
    node: NodeId,
    branches: &[domain::Branch],
    hashes: &[Hash],
) -> Result<BranchName, Unrecorded> {
    for name in fork_names(hashes) {
        let name = name?;
        match branches.iter().find(|b| b.name == name) {
            None => return Ok(name),
            Some(b) if b.head.is_some_and(|(h, _)| h == node) => return Ok(name),
            Some(_) => {}
        }
    }
    Err(Unrecorded("too many forks at one node"))
}

/// What is stored of `conv`, without writing anything (for `count_tokens`): its session, if it
/// has one, and the longest stored prefix (last index and node).
pub async fn peek(
    store: &Store,
    tenant: &Tenant,
    named: Option<&str>,
    conv: &Conversation,
) -> Option<(Scoped, Option<(usize, NodeId)>)> {
    let contents: Vec<&NodeContent> = conv.items.iter().map(|i| &i.content).collect();
    let hashes = chain_hashes(&contents, None);
    let opening = opening_key(&conv.opening);
    let find = |name: String| async move {
        let metadata = BTreeMap::from([(KEY_METADATA.to_owned(), name.clone())]);
        store
            .find_session_for_key(tenant, format!("ctxd-gateway:{name}"), &metadata)
            .await
            .ok()
            .flatten()
    };
    let name = match named {
        Some(name) => match SessionId::parse("x-ctxd-session", name) {
            Ok(id) => match store.scope(tenant, id).await {
                Ok(scoped) => {
                    let stored = stored_prefix(store, scoped, &hashes).await.ok()?;
                    if stored.is_some() {
                        return Some((scoped, stored));
                    }
                    return find(format!("{id}/{opening}")).await.map(|s| (s, None));
                }
                Err(_) => name.to_owned(),
            },
            Err(_) => name.to_owned(),
        },
        None => match &conv.client_session {
            Some(id) => format!("agent:{id}"),
            None => format!("opening:{opening}"),
        },
    };
    for candidate in [name.clone(), format!("{name}/{opening}")] {
        if let Some(session) = find(candidate).await {
            let stored = stored_prefix(store, session, &hashes).await.ok()?;
            if stored.is_some() {
                return Some((session, stored));
            }
        }
    }
    None
}
