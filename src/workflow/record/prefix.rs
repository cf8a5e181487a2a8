//! How much of a request's history is stored already (found by node hash), and where the rest
//! goes: the branch whose head it extends, or a fork at the last shared node.

use super::subagent::Calls;
use super::{Plan, Unrecorded, store_error};
use crate::domain::{self, BranchName, Hash, NodeContent, NodeId, node_hash};
use crate::store::{self, PathTarget, Scoped, Store};

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

/// [`chain_hashes`] of items whose first ones' hashes are `known` and the rest `rest`, at the
/// top level.
pub(super) fn chain_hashes_after(known: &[Hash], rest: &[&NodeContent]) -> Vec<Hash> {
    let mut out = Vec::with_capacity(known.len() + rest.len());
    out.extend_from_slice(known);
    for content in rest {
        let parent = out.last();
        out.push(node_hash(parent, None, content));
    }
    out
}

/// The longest stored prefix, found first among the branch heads (an agent's request
/// usually extends one: its newest messages are new, the rest is the head's history), then by
/// the search of [`stored_prefix`]. A head's match is taken once the next message is not
/// stored, so a longer prefix stored off every head is still found.
pub(super) async fn prefix_from_heads(
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
pub(super) async fn stored_prefix(
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

/// A request's history as recording reads it against one session: its node contents, their
/// chain hashes, and the session's branches as listed for this attempt.
#[derive(Clone, Copy)]
pub(super) struct Against<'a> {
    pub store: &'a Store,
    pub session: Scoped,
    pub branches: &'a [domain::Branch],
    pub contents: &'a [&'a NodeContent],
    pub hashes: &'a [Hash],
}

impl<'a> Against<'a> {
    pub(super) fn new(
        (store, session): (&'a Store, Scoped),
        branches: &'a [domain::Branch],
        (contents, hashes): (&'a [&'a NodeContent], &'a [Hash]),
    ) -> Self {
        Self {
            store,
            session,
            branches,
            contents,
            hashes,
        }
    }
}

/// Where the request's history goes after its stored prefix ends at `node` (`done` items
/// matched by hash). The branches through `node` are read on: a sub-agent's call and result
/// are stored as a function (its call node, then its result), which the client resends as a
/// tool result, so the stored path and the request are compared node by node from there. The
/// request extends the branch that holds most of it; where it leaves a branch before its head,
/// a new branch forks at the last shared node, named after the request's history so a retry
/// finds the same one.
pub(super) async fn extend_as(
    h: &Against<'_>,
    node: NodeId,
    done: usize,
    forking: Fork,
) -> Result<Plan, Unrecorded> {
    let (store, session, branches) = (h.store, h.session, h.branches);
    let (contents, hashes) = (h.contents, h.hashes);
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

/// The plan of a request whose history's longest stored prefix ends on a branch (see
/// [`prefix_from_heads`], [`extend_as`]); `None` where no node of it is stored.
pub(super) async fn from_stored_prefix(
    h: &Against<'_>,
    forking: Fork,
) -> Result<Option<Plan>, Unrecorded> {
    let found = prefix_from_heads(h.store, h.session, h.branches, h.hashes).await?;
    let Some((k, node)) = found else {
        return Ok(None);
    };
    Ok(Some(extend_as(h, node, k + 1, forking).await?))
}

/// The branches that have a head, `main` first, then by name: the order a request's history
/// is looked for in them.
pub(super) fn with_heads(branches: &[domain::Branch]) -> Vec<&domain::Branch> {
    let mut order: Vec<&domain::Branch> = branches.iter().filter(|b| b.head.is_some()).collect();
    order.sort_by_key(|b| (b.name != BranchName::main(), b.name.as_str().to_owned()));
    order
}

/// Whether extending a branch makes the fork it needs or only names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fork {
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
            (s, c) => s.says_same(c),
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
