//! Recording a request: which session it belongs to, how much of its history is stored
//! already (found by node hash), and where the rest goes (the branch whose head it extends, or
//! a new branch forked at the last shared node).

use std::collections::BTreeMap;

use super::conversation::Conversation;
use crate::domain::{
    self, BranchName, Hash, NodeContent, NodeId, Part, SessionId, Tenant, node_hash,
};
use crate::store::{self, AppendRequest, AppendTarget, Scoped, Store};

/// Where a recorded request went: the branch and its head after the request's messages (what
/// the answer is appended to).
#[derive(Debug, Clone)]
pub struct Recorded {
    pub session: Scoped,
    pub branch: BranchName,
    pub head: Option<NodeId>,
}

/// Why a request was not recorded; it is forwarded as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unrecorded(pub &'static str);

/// The session key stored in a gateway session's metadata.
pub const KEY_METADATA: &str = "ctxd.gateway.key";

/// How many times a request is matched again when another request moved its branch between
/// the match and the append.
const ATTEMPTS: usize = 4;

/// Records `conv` for `tenant`: finds or makes its session, appends what it does not hold.
pub async fn record(
    store: &Store,
    tenant: &Tenant,
    named: Option<&str>,
    conv: &Conversation,
    max_part_bytes: usize,
) -> Result<Recorded, Unrecorded> {
    let contents: Vec<NodeContent> = conv.items.iter().map(|i| i.content.clone()).collect();
    for (i, content) in contents.iter().enumerate() {
        if content.validate(&format!("messages[{i}]")).is_err() {
            return Err(Unrecorded("a message ctxd cannot store"));
        }
        if oversized(content, max_part_bytes) {
            return Err(Unrecorded("a part over --max-part-bytes"));
        }
    }
    if contents.is_empty() {
        return Err(Unrecorded("no messages"));
    }
    let hashes = chain_hashes(&contents);
    let opening = opening_key(&conv.opening);
    let key = match named {
        Some(name) => match SessionId::parse("x-ctxd-session", name) {
            Ok(id) if store.scope(tenant, id).await.is_ok() => Key::Session(id),
            _ => Key::Named(name.to_owned()),
        },
        None => match &conv.client_session {
            Some(id) => Key::Named(format!("claude-code:{id}")),
            None => Key::Named(format!("opening:{opening}")),
        },
    };
    let mut session = open(store, tenant, &key).await?;
    for attempt in 0.. {
        let stored = stored_prefix(store, session, &hashes).await?;
        let (branch, expected) = match stored {
            Some(k) => {
                let node = k.1;
                (at_node(store, session, node, &hashes).await?, Some(node))
            }
            None => {
                let branches = store.list_branches(session).await.map_err(store_error)?;
                if branches.iter().all(|b| b.head.is_none())
                    && let Some(main) = branches.iter().find(|b| b.name == BranchName::main())
                {
                    (main.name.clone(), None)
                } else {
                    // A conversation that shares nothing with this session (a sub-agent's own,
                    // under its parent's session id): a session of its own, never a fork.
                    let own = match &key {
                        Key::Session(id) => Key::Named(format!("{id}/{opening}")),
                        Key::Named(name) if name.starts_with("opening:") => {
                            return Err(Unrecorded(
                                "a derived session that holds another conversation",
                            ));
                        }
                        Key::Named(name) => Key::Named(format!("{name}/{opening}")),
                    };
                    session = open(store, tenant, &own).await?;
                    if attempt + 1 >= ATTEMPTS {
                        return Err(Unrecorded("sessions kept changing"));
                    }
                    continue;
                }
            }
        };
        let done = stored.map_or(0, |(k, _)| k + 1);
        if done == contents.len() {
            return Ok(Recorded {
                session,
                branch,
                head: expected,
            });
        }
        let request = AppendRequest {
            session,
            target: AppendTarget::Branch(branch.clone()),
            expected_head: Some(expected),
            idempotency_key: None,
            nodes: contents[done..].to_vec(),
            pinned: Vec::new(),
        };
        match store.append(request).await {
            Ok(outcome) => {
                let head = NodeId::parse("head_id", &outcome.head_id).ok();
                metrics::counter!("ctxd_appended_nodes_total")
                    .increment(outcome.node_ids.len() as u64);
                return Ok(Recorded {
                    session,
                    branch,
                    head,
                });
            }
            Err(store::Error::Domain(domain::Error::Aborted(_))) if attempt + 1 < ATTEMPTS => {
                continue;
            }
            Err(store::Error::Domain(
                domain::Error::InvalidArgument { .. } | domain::Error::FailedPrecondition(_),
            )) => return Err(Unrecorded("pairing")),
            Err(e) => return Err(store_error(e)),
        }
    }
    Err(Unrecorded("sessions kept changing"))
}

/// How a request names its session.
enum Key {
    Session(SessionId),
    Named(String),
}

async fn open(store: &Store, tenant: &Tenant, key: &Key) -> Result<Scoped, Unrecorded> {
    match key {
        Key::Session(id) => store.scope(tenant, *id).await.map_err(store_error),
        Key::Named(name) => {
            let metadata = BTreeMap::from([(KEY_METADATA.to_owned(), name.clone())]);
            store
                .session_for_key(tenant, format!("ctxd-gateway:{name}"), metadata)
                .await
                .map_err(store_error)
        }
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

/// The hash each node would have as a chain from the root: `hashes[i]` covers items 0..=i.
pub fn chain_hashes(contents: &[NodeContent]) -> Vec<Hash> {
    let mut out: Vec<Hash> = Vec::with_capacity(contents.len());
    for content in contents {
        let parent = out.last();
        out.push(node_hash(parent, None, content));
    }
    out
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

/// The branch to extend from `node`: one whose head it is (`main` first), else a new branch
/// forked there, named after the request's history so a retry finds the same one.
async fn at_node(
    store: &Store,
    session: Scoped,
    node: NodeId,
    hashes: &[Hash],
) -> Result<BranchName, Unrecorded> {
    let branches = store.list_branches(session).await.map_err(store_error)?;
    let mut at: Vec<&domain::Branch> = branches
        .iter()
        .filter(|b| b.head.is_some_and(|(h, _)| h == node))
        .collect();
    at.sort_by_key(|b| (b.name != BranchName::main(), b.name.as_str().to_owned()));
    if let Some(b) = at.first() {
        return Ok(b.name.clone());
    }
    let last = hashes.last().map(Hash::to_hex).unwrap_or_default();
    for n in 1..10 {
        let name = match n {
            1 => format!("gw-{}", &last[..12]),
            n => format!("gw-{}-{n}", &last[..12]),
        };
        let name = BranchName::parse("branch", &name).map_err(|_| Unrecorded("branch name"))?;
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

fn oversized(content: &NodeContent, max: usize) -> bool {
    let parts = |parts: &[Part]| {
        parts.iter().any(|p| match p {
            Part::Text(t) => t.len() > max,
            Part::Media {
                source: domain::MediaSource::Data(d),
                ..
            } => d.len() > max,
            Part::Media {
                source: domain::MediaSource::Url(u),
                ..
            } => u.len() > max,
        })
    };
    match content {
        NodeContent::Message {
            parts: p,
            tool_calls,
            ..
        } => parts(p) || tool_calls.iter().any(|c| c.arguments_json.len() > max),
        NodeContent::ToolResult { parts: p, .. } => parts(p),
        NodeContent::FunctionCall { input, .. } => input.len() > max,
        NodeContent::FunctionResult(r) => r.output.len() > max,
    }
}

/// What is stored of `conv`, without writing anything (for `count_tokens`): its session, if it
/// has one, and the longest stored prefix (last index and node).
pub async fn peek(
    store: &Store,
    tenant: &Tenant,
    named: Option<&str>,
    conv: &Conversation,
) -> Option<(Scoped, Option<(usize, NodeId)>)> {
    let contents: Vec<NodeContent> = conv.items.iter().map(|i| i.content.clone()).collect();
    let hashes = chain_hashes(&contents);
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
            Some(id) => format!("claude-code:{id}"),
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
