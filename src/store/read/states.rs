//! Branch starts remembered between renders: a branch's head with its session's summaries and
//! pins, what a render reads before the path. This process's writes keep them true as they
//! commit (an append moves the head it extended; any other write forgets the session); a
//! commit by another connection or process empties them all (`Store::states_valid`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::domain::{BranchName, NodeId, SessionId, Summary};

/// A branch as a render starts from it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct RenderStart {
    /// `None`: the branch has no node yet.
    pub(super) head: Option<NodeId>,
    pub(super) summaries: Vec<Summary>,
    pub(super) pinned: Vec<NodeId>,
}

/// Sessions followed at most; past that the map starts over.
const SESSIONS: usize = 50_000;

#[derive(Default)]
pub(super) struct BranchStates(Mutex<Inner>);

#[derive(Default)]
struct Inner {
    sessions: HashMap<SessionId, SessionStarts>,
    /// Times the map was emptied: with a session's version, what a reader checks before keeping
    /// what it read.
    epoch: u64,
}

#[derive(Default)]
struct SessionStarts {
    /// Changes of the session since the map was last emptied.
    version: u64,
    branches: HashMap<BranchName, Arc<RenderStart>>,
}

/// What the states were when a reader began reading a session: what it read may be kept only
/// if nothing changed the session meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ticket {
    epoch: u64,
    version: u64,
}

impl BranchStates {
    pub(super) fn get(&self, session: SessionId, branch: &BranchName) -> Option<Arc<RenderStart>> {
        self.lock()
            .sessions
            .get(&session)?
            .branches
            .get(branch)
            .cloned()
    }

    /// Taken before reading `session` from the database, for [`BranchStates::keep`].
    pub(super) fn ticket(&self, session: SessionId) -> Ticket {
        let inner = self.lock();
        Ticket {
            epoch: inner.epoch,
            version: inner.sessions.get(&session).map_or(0, |s| s.version),
        }
    }

    /// Remembers `start`, read after `ticket` was taken, unless a write to the session (or an
    /// emptying) came in between: what was read may predate it.
    pub(super) fn keep(
        &self,
        ticket: Ticket,
        session: SessionId,
        branch: &BranchName,
        start: Arc<RenderStart>,
    ) {
        let mut inner = self.lock();
        let version = inner.sessions.get(&session).map_or(0, |s| s.version);
        if ticket
            != (Ticket {
                epoch: inner.epoch,
                version,
            })
        {
            return;
        }
        inner
            .session(session)
            .branches
            .insert(branch.clone(), start);
    }

    /// `branch` of `session` moved from `from` to `to` by appends this process committed.
    pub(super) fn advance(
        &self,
        session: SessionId,
        branch: &BranchName,
        from: Option<NodeId>,
        to: Option<NodeId>,
    ) {
        if from == to {
            return;
        }
        let mut inner = self.lock();
        let starts = inner.session(session);
        starts.version += 1;
        match starts.branches.get_mut(branch) {
            Some(start) if start.head == from => Arc::make_mut(start).head = to,
            Some(_) => {
                starts.branches.remove(branch);
            }
            None => {}
        }
    }

    /// Something other than an append changed `session` (a branch, a summary, a pin, its
    /// deletion): its starts are read again.
    pub(super) fn forget(&self, session: SessionId) {
        let mut inner = self.lock();
        let starts = inner.session(session);
        starts.version += 1;
        starts.branches.clear();
    }

    /// Another connection may have committed anything.
    pub(super) fn clear(&self) {
        let mut inner = self.lock();
        inner.sessions.clear();
        inner.epoch += 1;
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Plain data: a panic while holding the lock leaves nothing half-changed to fear.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Inner {
    fn session(&mut self, session: SessionId) -> &mut SessionStarts {
        if self.sessions.len() >= SESSIONS && !self.sessions.contains_key(&session) {
            self.sessions.clear();
            self.epoch += 1;
        }
        self.sessions.entry(session).or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(head: Option<NodeId>) -> Arc<RenderStart> {
        Arc::new(RenderStart {
            head,
            summaries: Vec::new(),
            pinned: Vec::new(),
        })
    }

    #[test]
    fn a_read_overtaken_by_a_write_is_not_kept() {
        let (states, session, main) = (
            BranchStates::default(),
            SessionId::new(),
            BranchName::main(),
        );
        let (a, b) = (NodeId::new(), NodeId::new());
        let ticket = states.ticket(session);
        states.advance(session, &main, Some(a), Some(b));
        states.keep(ticket, session, &main, start(Some(a)));
        assert_eq!(states.get(session, &main), None);

        let ticket = states.ticket(session);
        states.clear();
        states.keep(ticket, session, &main, start(Some(b)));
        assert_eq!(states.get(session, &main), None);

        let ticket = states.ticket(session);
        states.keep(ticket, session, &main, start(Some(b)));
        assert_eq!(states.get(session, &main).unwrap().head, Some(b));
    }

    #[test]
    fn an_append_moves_the_head_it_extended_and_forgets_another() {
        let (states, session, main) = (
            BranchStates::default(),
            SessionId::new(),
            BranchName::main(),
        );
        let (a, b, c) = (NodeId::new(), NodeId::new(), NodeId::new());
        states.keep(states.ticket(session), session, &main, start(Some(a)));
        states.advance(session, &main, Some(a), Some(b));
        assert_eq!(states.get(session, &main).unwrap().head, Some(b));
        // From a head it does not hold: some write it did not see came in between.
        states.advance(session, &main, Some(c), Some(a));
        assert_eq!(states.get(session, &main), None);

        states.keep(states.ticket(session), session, &main, start(Some(a)));
        states.forget(session);
        assert_eq!(states.get(session, &main), None);
    }
}
