//! The change signal: which session a committed write touched, for watchers to re-read, and
//! for the branch starts renders remember (`states`) to follow.
//!
//! A signal carries no data and is sent only after the write's COMMIT, so a watcher that
//! wakes on it reads what was committed. It is a hint, never the record: a receiver that lags
//! (its buffer overflowed) re-reads every session it follows, and watchers also poll, because
//! another process sharing a PostgreSQL database commits without signalling this one.

use std::sync::Arc;

use tokio::sync::broadcast;

use super::states::BranchStates;
use crate::domain::{BranchName, NodeId, SessionId};

/// Signals buffered per receiver before it lags.
const BUFFERED: usize = 1024;

/// The sending side, shared by the group committer and every other write.
#[derive(Clone)]
pub struct Changes {
    signal: broadcast::Sender<SessionId>,
    states: Arc<BranchStates>,
}

impl Changes {
    pub(in crate::store) fn new() -> Self {
        Self {
            signal: broadcast::channel(BUFFERED).0,
            states: Arc::default(),
        }
    }

    /// `session` has a committed change other than appends: the starts remembered for its
    /// branches are read again. Signalling costs nothing when nobody watches.
    pub(in crate::store) fn touched(&self, session: SessionId) {
        self.states.forget(session);
        self.signal(session);
    }

    /// Appends to `session` committed, moving each of `moved` (a branch, its head before
    /// and after); `pinned`: they pinned nodes too.
    pub(in crate::store) fn appended(
        &self,
        session: SessionId,
        moved: &[(&BranchName, Option<NodeId>, Option<NodeId>)],
        pinned: bool,
    ) {
        if pinned {
            self.states.forget(session);
        } else {
            for (branch, from, to) in moved {
                self.states.advance(session, branch, *from, *to);
            }
        }
        self.signal(session);
    }

    fn signal(&self, session: SessionId) {
        if self.signal.receiver_count() > 0 {
            // No receiver is not an error: nobody is watching.
            let _ = self.signal.send(session);
        }
    }

    pub(super) fn subscribe(&self) -> broadcast::Receiver<SessionId> {
        self.signal.subscribe()
    }

    pub(super) fn states(&self) -> &BranchStates {
        &self.states
    }
}
