//! The change signal: which session a committed write touched, for watchers to re-read.
//!
//! A signal carries no data and is sent only after the write's COMMIT, so a watcher that
//! wakes on it reads what was committed. It is a hint, never the record: a receiver that lags
//! (its buffer overflowed) re-reads every session it follows, and watchers also poll, because
//! another process sharing a PostgreSQL database commits without signalling this one.

use tokio::sync::broadcast;

use crate::domain::SessionId;

/// Signals buffered per receiver before it lags.
const BUFFERED: usize = 1024;

/// The sending side, shared by the group committer and every other write.
#[derive(Clone)]
pub struct Changes(broadcast::Sender<SessionId>);

impl Changes {
    pub(super) fn new() -> Self {
        Self(broadcast::channel(BUFFERED).0)
    }

    /// `session` has a committed change. Costs nothing when nobody watches.
    pub(super) fn touched(&self, session: SessionId) {
        if self.0.receiver_count() > 0 {
            // No receiver is not an error: nobody is watching.
            let _ = self.0.send(session);
        }
    }

    pub(super) fn subscribe(&self) -> broadcast::Receiver<SessionId> {
        self.0.subscribe()
    }
}
