//! Watching: what changed in a session since a watcher's [`Position`], read from the stored
//! state. The store keeps no event log (appends pay nothing for watchers): a watcher remembers
//! the heads it reported, and each step reads the heads now and reports the difference, oldest
//! first, at most a page at a time.

use std::collections::{BTreeMap, HashSet};

use tokio::sync::broadcast;

use super::reads::hydrate;
use super::{Result, Scoped, Store};
use crate::domain::{
    self, Branch, BranchName, CompactionEvent, Node, NodeContent, NodeId, SessionId,
};
use crate::store::backend::Reads;

/// How far a watcher has reported, and so where it resumes: the heads it last reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    /// Each followed branch and the head last reported for it.
    pub heads: BTreeMap<BranchName, Option<NodeId>>,
    /// Each running function followed (found on a followed chain) and the last node of its
    /// chain reported; a function leaves once its result is reported or it is closed and
    /// reported to its end.
    pub functions: BTreeMap<NodeId, Option<NodeId>>,
    /// Compaction events reported (of the followed branch, or of the whole session). Events
    /// are only ever added, so a count is a position.
    pub events: u64,
}

/// One thing a watcher is told.
#[derive(Debug, Clone)]
pub enum Change {
    /// A node appended to `branch`, or to a function's chain (`branch` is `None`;
    /// `node.function_id` names the function).
    Node {
        branch: Option<BranchName>,
        node: Node,
    },
    /// The branch moved other than by appends (a reset): to its head here.
    HeadMoved(Branch),
    BranchCreated(Branch),
    /// The branch is gone; `head` is the last head reported for it.
    BranchDeleted {
        name: BranchName,
        head: Option<NodeId>,
    },
    Compaction(CompactionEvent),
}

/// Nodes read from the database at a time.
const PAGE: usize = 256;

/// Nodes before a head searched for the function calls still running there: the pairing
/// state of a chain lives after its latest message, so running calls are in its last few
/// nodes.
const TAIL_SCAN: u32 = 256;

impl Store {
    /// A receiver of change signals (sessions whose writes committed), made before the state
    /// a watch starts from is read, so no commit after that read goes unsignalled.
    pub fn watch_signal(&self) -> broadcast::Receiver<SessionId> {
        self.changes.subscribe()
    }

    /// The position of a watch starting now, and the followed branches: nothing is replayed.
    /// `branch` must exist.
    pub async fn watch_start(
        &self,
        session: Scoped,
        branch: Option<&BranchName>,
    ) -> Result<(Position, Vec<Branch>)> {
        let (mut conn, session) = self.read_session(session).await?;
        let branches = followed(&mut *conn, session, branch).await?;
        if let Some(name) = branch
            && branches.is_empty()
        {
            return Err(domain::Error::not_found("branch", name).into());
        }
        let mut position = Position::default();
        for b in &branches {
            let head = b.head.map(|(id, _)| id);
            position.heads.insert(b.name.clone(), head);
            if let Some(head) = head {
                running_functions(&mut *conn, session, head, &mut position.functions).await?;
            }
        }
        position.events = conn.events(session, branch).await?.len() as u64;
        Ok((position, branches))
    }

    /// The position right after node `after` of `branch` (a node of its path now), and the
    /// branch. Functions running at that node are followed from their heads now, and
    /// compaction events from now: a node says nothing about those.
    pub async fn watch_after_node(
        &self,
        session: Scoped,
        branch: &BranchName,
        after: NodeId,
    ) -> Result<(Position, Vec<Branch>)> {
        let (mut conn, session) = self.read_session(session).await?;
        let branches = followed(&mut *conn, session, Some(branch)).await?;
        let Some(current) = branches.first() else {
            return Err(domain::Error::not_found("branch", branch).into());
        };
        conn.node_row(session, after, "after_node_id").await?;
        let on_branch = match current.head {
            Some((head, _)) => head == after || conn.path_to(session, head).await?.contains(&after),
            None => false,
        };
        if !on_branch {
            return Err(domain::Error::invalid(
                "after_node_id",
                format!("node {after} is not on branch {branch:?}"),
            )
            .into());
        }
        let mut position = Position::default();
        position.heads.insert(branch.clone(), Some(after));
        running_functions(&mut *conn, session, after, &mut position.functions).await?;
        position.events = conn.events(session, Some(branch)).await?.len() as u64;
        Ok((position, branches))
    }

    /// Checks a position a client sent back (every node it names is a node of the session)
    /// and answers the followed branches now.
    pub async fn watch_resume(
        &self,
        session: Scoped,
        branch: Option<&BranchName>,
        position: &Position,
    ) -> Result<Vec<Branch>> {
        let (mut conn, session) = self.read_session(session).await?;
        let named: HashSet<NodeId> = position
            .heads
            .values()
            .flatten()
            .chain(position.functions.keys())
            .chain(position.functions.values().flatten())
            .copied()
            .collect();
        let named: Vec<NodeId> = named.into_iter().collect();
        let mut found = 0;
        for ids in named.chunks(PAGE) {
            found += conn.nodes(session, ids).await?.len();
        }
        if found != named.len() {
            return Err(domain::Error::invalid(
                "after_cursor",
                "names nodes this session does not have: a cursor of another session?",
            )
            .into());
        }
        followed(&mut *conn, session, branch).await
    }

    /// What changed since `position`, oldest first, each with the position right after it:
    /// branches created; per branch (by name) its new nodes, with the chains of the functions
    /// they run before each function's result, or a head move to the last node it shares with
    /// the reported head and then the nodes after it; functions still running, to their heads;
    /// compaction events; branches deleted. At most about `max` changes; `true` when there is
    /// more to read at once.
    pub async fn watch_changes(
        &self,
        session: Scoped,
        branch: Option<&BranchName>,
        position: &Position,
        max: usize,
    ) -> Result<(Vec<(Change, Position)>, bool)> {
        // A deleted session ends the watch as NOT_FOUND.
        let (mut conn, session) = self.read_session(session).await?;
        let mut walk = Walk {
            store: self,
            conn: &mut *conn,
            session,
            position: position.clone(),
            out: Vec::new(),
            max: max.max(1),
        };
        walk.step(branch).await?;
        let more = walk.full();
        Ok((walk.out, more))
    }
}

/// One step of a watcher: reads and the changes found so far.
struct Walk<'a> {
    store: &'a Store,
    conn: &'a mut dyn Reads,
    session: SessionId,
    position: Position,
    out: Vec<(Change, Position)>,
    max: usize,
}

impl Walk<'_> {
    fn full(&self) -> bool {
        self.out.len() >= self.max
    }

    /// Records `change`; the position is already the one after it.
    fn emit(&mut self, change: Change) {
        self.out.push((change, self.position.clone()));
    }

    async fn step(&mut self, filter: Option<&BranchName>) -> Result<()> {
        let branches = followed(self.conn, self.session, filter).await?;
        for b in &branches {
            if self.full() {
                return Ok(());
            }
            if !self.position.heads.contains_key(&b.name) {
                let head = b.head.map(|(id, _)| id);
                self.position.heads.insert(b.name.clone(), head);
                if let Some(head) = head {
                    let mut running = BTreeMap::new();
                    running_functions(self.conn, self.session, head, &mut running).await?;
                    for (function, at) in running {
                        self.position.functions.entry(function).or_insert(at);
                    }
                }
                self.emit(Change::BranchCreated(b.clone()));
            }
        }
        for b in &branches {
            self.advance_branch(b).await?;
            if self.full() {
                return Ok(());
            }
        }
        self.advance_functions().await?;
        if self.full() {
            return Ok(());
        }
        let events = self.conn.events(self.session, filter).await?;
        let reported = usize::try_from(self.position.events).unwrap_or(usize::MAX);
        for event in events.into_iter().skip(reported) {
            if self.full() {
                return Ok(());
            }
            self.position.events += 1;
            self.emit(Change::Compaction(event));
        }
        let names: HashSet<&BranchName> = branches.iter().map(|b| &b.name).collect();
        let gone: Vec<BranchName> = self
            .position
            .heads
            .keys()
            .filter(|name| !names.contains(name))
            .cloned()
            .collect();
        for name in gone {
            if self.full() {
                return Ok(());
            }
            let head = self.position.heads.remove(&name).flatten();
            self.emit(Change::BranchDeleted { name, head });
        }
        Ok(())
    }

    /// Reports how `b` moved from the head last reported for it.
    async fn advance_branch(&mut self, b: &Branch) -> Result<()> {
        let new = b.head.map(|(id, _)| id);
        let Some(&old) = self.position.heads.get(&b.name) else {
            return Ok(());
        };
        if old == new {
            return Ok(());
        }
        let Some(new) = new else {
            self.position.heads.insert(b.name.clone(), None);
            self.emit(Change::HeadMoved(b.clone()));
            return Ok(());
        };
        let ids = match self.ids_after(old, new).await? {
            Some(ids) => ids,
            None => {
                // Not an append: the branch was reset. Report the move to the last node both
                // paths share, then the nodes after it, so the watcher's view stays a chain.
                let old_path = match old {
                    Some(old) => self.store.path_ids(self.conn, self.session, old).await?,
                    None => Default::default(),
                };
                let new_path = self.store.path_ids(self.conn, self.session, new).await?;
                let shared = old_path
                    .iter()
                    .zip(new_path.iter())
                    .take_while(|(a, b)| a == b)
                    .count();
                let base = shared.checked_sub(1).map(|i| new_path[i]);
                let head = match base {
                    Some(id) => {
                        Some((id, self.conn.node_row(self.session, id, "head").await?.hash))
                    }
                    None => None,
                };
                self.position.heads.insert(b.name.clone(), base);
                self.emit(Change::HeadMoved(Branch {
                    name: b.name.clone(),
                    head,
                    updated_at_ms: b.updated_at_ms,
                }));
                new_path[shared..].iter().take(self.max).copied().collect()
            }
        };
        self.report(Some(&b.name), None, &ids).await
    }

    /// The ids after `old` on the path to `new`, oldest first; `None` when `old` is not on it.
    /// The usual case (a few appends) reads one page of ancestors; a longer way reads the
    /// path's ids.
    async fn ids_after(&mut self, old: Option<NodeId>, new: NodeId) -> Result<Option<Vec<NodeId>>> {
        let rows = self
            .conn
            .ancestors(self.session, new, Some(PAGE as u32))
            .await?;
        let ids: Vec<NodeId> = rows.iter().map(|r| r.id).collect();
        let whole = rows.len() < PAGE || rows.first().is_some_and(|r| r.parent_id.is_none());
        let ids = if whole {
            ids
        } else {
            if let Some(old) = old
                && let Some(i) = ids.iter().position(|id| *id == old)
            {
                return Ok(Some(ids[i + 1..].to_vec()));
            }
            // Far behind (a resume after a long disconnect): the path's ids, from the read
            // cache after the first step, so catching up page by page reads them once.
            let path = self.store.path_ids(self.conn, self.session, new).await?;
            return Ok(self.after(&path, old));
        };
        Ok(self.after(&ids, old))
    }

    /// The ids of `path` after `old` (all when `None`), as many as one step reports at most;
    /// `None` when `old` is not on it.
    fn after(&self, path: &[NodeId], old: Option<NodeId>) -> Option<Vec<NodeId>> {
        let from = match old {
            None => 0,
            Some(old) => path.iter().position(|id| *id == old)? + 1,
        };
        // Each id is at least one change, so a step never reports more than `max` of them.
        Some(path[from..].iter().take(self.max).copied().collect())
    }

    /// Reports the nodes `ids` of `branch` (or, with `branch` `None`, of `function`'s chain),
    /// in order. Before a function's result, the rest of that function's chain.
    async fn report(
        &mut self,
        branch: Option<&BranchName>,
        function: Option<NodeId>,
        ids: &[NodeId],
    ) -> Result<()> {
        for page in ids.chunks(PAGE) {
            if self.full() {
                return Ok(());
            }
            let nodes = self
                .store
                .nodes_by_id(self.conn, self.session, page)
                .await?;
            for node in nodes {
                if self.full() {
                    return Ok(());
                }
                if let NodeContent::FunctionResult(result) = &node.content
                    && let Some(chain) = &result.chain
                    && self.position.functions.contains_key(&chain.function_id)
                {
                    Box::pin(self.advance_function(chain.function_id, chain.head_id)).await?;
                    if self.full() {
                        return Ok(());
                    }
                    self.position.functions.remove(&chain.function_id);
                }
                match (branch, function) {
                    (Some(name), _) => {
                        self.position.heads.insert(name.clone(), Some(node.id));
                    }
                    (None, Some(function)) => {
                        self.position.functions.insert(function, Some(node.id));
                    }
                    (None, None) => {}
                }
                if matches!(node.content, NodeContent::FunctionCall { .. }) {
                    self.position.functions.insert(node.id, None);
                }
                self.emit(Change::Node {
                    branch: branch.cloned(),
                    node: Node::clone(&node),
                });
            }
        }
        Ok(())
    }

    /// Reports `function`'s chain from the node last reported to `head`.
    async fn advance_function(&mut self, function: NodeId, head: Option<NodeId>) -> Result<()> {
        let Some(&last) = self.position.functions.get(&function) else {
            return Ok(());
        };
        let Some(head) = head else {
            return Ok(());
        };
        if last == Some(head) {
            return Ok(());
        }
        let chain: Vec<NodeId> = self
            .conn
            .chain(self.session, head, function)
            .await?
            .iter()
            .map(|r| r.id)
            .collect();
        let from = match last {
            None => 0,
            // A node not on the chain cannot be a position this watcher reported; report the
            // chain whole rather than skip any of it.
            Some(last) => chain.iter().position(|id| *id == last).map_or(0, |i| i + 1),
        };
        self.report(None, Some(function), &chain[from..]).await
    }

    /// Brings every followed function to its head; drops those closed and reported whole
    /// (their result is on a branch not followed, or not yet read).
    async fn advance_functions(&mut self) -> Result<()> {
        let mut checked = HashSet::new();
        loop {
            // Functions opened inside chains while this runs are taken in the next round.
            let todo: Vec<NodeId> = self
                .position
                .functions
                .keys()
                .filter(|f| !checked.contains(*f))
                .copied()
                .collect();
            if todo.is_empty() {
                return Ok(());
            }
            for function in todo {
                checked.insert(function);
                if self.full() {
                    return Ok(());
                }
                let Some((head, closed)) = self.conn.find_function(self.session, function).await?
                else {
                    self.position.functions.remove(&function);
                    continue;
                };
                self.advance_function(function, head).await?;
                if self.full() {
                    return Ok(());
                }
                if closed && self.position.functions.get(&function) == Some(&head) {
                    self.position.functions.remove(&function);
                }
            }
        }
    }
}

/// The followed branches: `filter`'s alone (none if it does not exist), or all.
async fn followed(
    conn: &mut dyn Reads,
    session: SessionId,
    filter: Option<&BranchName>,
) -> Result<Vec<Branch>> {
    let mut branches = conn.branches(session).await?;
    if let Some(name) = filter {
        branches.retain(|b| &b.name == name);
    }
    Ok(branches)
}

/// Adds the functions running at `at` (called in its chain's tail, not yet closed), and those
/// running inside them, each with its chain's head now.
async fn running_functions(
    conn: &mut dyn Reads,
    session: SessionId,
    at: NodeId,
    into: &mut BTreeMap<NodeId, Option<NodeId>>,
) -> Result<()> {
    let mut todo = vec![at];
    while let Some(at) = todo.pop() {
        let rows = conn.ancestors(session, at, Some(TAIL_SCAN)).await?;
        let nodes = hydrate(conn, session, rows).await?;
        let scope = nodes.last().and_then(|n| n.function_id);
        for node in nodes.iter().rev() {
            // The tail ends at the chain's latest message, or where the chain began.
            if node.function_id != scope || matches!(node.content, NodeContent::Message { .. }) {
                break;
            }
            if matches!(node.content, NodeContent::FunctionCall { .. })
                && let Some((head, false)) = conn.find_function(session, node.id).await?
                && !into.contains_key(&node.id)
            {
                into.insert(node.id, head);
                if let Some(head) = head {
                    todo.push(head);
                }
            }
        }
    }
    Ok(())
}
