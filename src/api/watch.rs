//! Watch: a session or one branch followed as it changes, resumable by cursor.
//!
//! Each watch is one task. It reads what changed since its position (`Store::watch_changes`:
//! state differences, no event log), sends each change with the cursor of the position after
//! it, and sleeps until a commit of the session is signalled or the poll interval passes (a
//! commit by another server on the same PostgreSQL database signals nothing here). The stream
//! is a small bounded channel: the task reads a page, then waits for room, and a watcher that
//! leaves it full for `Limits::watch_fall_behind` is ended with RESOURCE_EXHAUSTED naming the
//! last cursor it was sent, so a slow reader costs a page of memory, never more.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::parse::{parse, session_id};
use super::service::{ContextStoreService, Reply, split};
use super::{convert, pb, status};
use crate::domain::{BranchName, NodeId, SessionId};
use crate::store::{Change, Position, Scoped, Store};

pub type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

/// Events a watch holds ready for its client; past them the task waits.
const BUFFERED: usize = 16;

/// Changes read from the database per step.
const STEP: usize = 64;

/// How often a watch reads without a signal: the latency of seeing commits made by another
/// server sharing the PostgreSQL database.
const POLL: Duration = Duration::from_secs(1);

/// Ends every watch when the server shuts down: a stream would otherwise hold its connection,
/// and so the server, open until the grace period ends.
#[derive(Clone)]
pub struct Watchers(Arc<watch::Sender<bool>>);

impl Default for Watchers {
    fn default() -> Self {
        Self(Arc::new(watch::channel(false).0))
    }
}

impl Watchers {
    /// Ends every watch (each with UNAVAILABLE and its cursor), now and from now on.
    pub fn stop(&self) {
        self.0.send_replace(true);
    }

    /// Turns `true` when the server shuts down (append streams end on it too).
    pub(super) fn subscribe(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }
}

impl ContextStoreService {
    /// The handle `server` uses to end every watch at shutdown.
    pub fn watchers(&self) -> Watchers {
        self.watchers.clone()
    }

    pub(super) async fn follow(&self, request: Request<pb::WatchRequest>) -> Reply<WatchStream> {
        let (tenant, request) = split(request);
        let session = session_id(&request.session_id)?;
        let branch = match request.branch.as_str() {
            "" => None,
            name => Some(parse(BranchName::parse("branch", name))?),
        };
        if !request.after_node_id.is_empty() {
            if branch.is_none() {
                return Err(Status::invalid_argument(
                    "after_node_id: resuming after a node needs `branch` (a node is on one \
                     branch); resume a whole-session watch with `after_cursor`",
                ));
            }
            if !request.after_cursor.is_empty() {
                return Err(Status::invalid_argument(
                    "after_node_id: give `after_cursor` or `after_node_id`, not both",
                ));
            }
        }
        // Decoded before the session is looked at: a malformed cursor is the caller's mistake
        // whatever the session.
        let cursor = match request.after_cursor.as_str() {
            "" => None,
            text => Some(decode(text, session, branch.as_ref())?),
        };
        let after_node = match request.after_node_id.as_str() {
            "" => None,
            text => Some(parse(NodeId::parse("after_node_id", text))?),
        };
        let scoped = self.scope(&tenant, session).await?;
        // Before the state is read: a commit after that read wakes the task.
        let signal = self.store.watch_signal();
        let (position, branches) = match (cursor, after_node, branch.as_ref()) {
            (Some(position), _, _) => {
                let branches = self
                    .store
                    .watch_resume(scoped, branch.as_ref(), &position)
                    .await
                    .map_err(status)?;
                (position, branches)
            }
            // A node without a branch was refused above.
            (None, Some(node), Some(name)) => self
                .store
                .watch_after_node(scoped, name, node)
                .await
                .map_err(status)?,
            (None, _, _) => self
                .store
                .watch_start(scoped, branch.as_ref())
                .await
                .map_err(status)?,
        };
        let (events, queue) = mpsc::channel(BUFFERED);
        let (end, ending) = oneshot::channel();
        let started = pb::WatchEvent {
            cursor: encode(session, branch.as_ref(), &position),
            branch: String::new(),
            event: Some(pb::watch_event::Event::Started(pb::WatchStarted {
                branches: branches.into_iter().map(convert::branch).collect(),
            })),
        };
        // Room for one event is certain in a new channel.
        let _ = events.try_send(started.clone());
        let task = Follower {
            store: self.store.clone(),
            session: scoped,
            branch,
            position,
            cursor: started.cursor,
            events,
            signal,
            stop: self.watchers.0.subscribe(),
            fall_behind: self.limits.watch_fall_behind,
        };
        tokio::spawn(async move {
            if let Some(status) = task.run().await {
                let _ = end.send(status);
            }
        });
        Ok(Response::new(Box::pin(Events {
            queue,
            ending: Some(ending),
        })))
    }
}

/// One watch's task.
struct Follower {
    store: Store,
    session: Scoped,
    branch: Option<BranchName>,
    position: Position,
    /// The cursor of the last event handed to the stream.
    cursor: String,
    events: mpsc::Sender<pb::WatchEvent>,
    signal: broadcast::Receiver<SessionId>,
    stop: watch::Receiver<bool>,
    fall_behind: Duration,
}

impl Follower {
    /// Follows until the client goes (`None`) or the watch ends with a status.
    async fn run(mut self) -> Option<Status> {
        loop {
            if *self.stop.borrow() {
                return Some(self.stopping());
            }
            let (changes, more) = match self
                .store
                .watch_changes(self.session, self.branch.as_ref(), &self.position, STEP)
                .await
            {
                Ok(step) => step,
                Err(e) => return self.deleted(e).await,
            };
            let pinned = if changes
                .iter()
                .any(|(c, _)| matches!(c, Change::Node { .. }))
            {
                match self.store.pinned(self.session).await {
                    Ok(pinned) => pinned,
                    Err(e) => return Some(self.failed(e)),
                }
            } else {
                Vec::new()
            };
            for (change, position) in changes {
                let cursor = encode(self.session.id(), self.branch.as_ref(), &position);
                let event = event(change, cursor.clone(), &pinned);
                match tokio::time::timeout(self.fall_behind, self.events.send(event)).await {
                    Ok(Ok(())) => {}
                    // The client is gone.
                    Ok(Err(_)) => return None,
                    Err(_) => {
                        return Some(Status::resource_exhausted(format!(
                            "the watcher fell behind: it read nothing for {:?} with {BUFFERED} \
                             events waiting; resume with after_cursor {}",
                            self.fall_behind, self.cursor
                        )));
                    }
                }
                self.position = position;
                self.cursor = cursor;
            }
            if more {
                continue;
            }
            if !self.wait().await {
                return if *self.stop.borrow() {
                    Some(self.stopping())
                } else {
                    None
                };
            }
        }
    }

    /// Sleeps until this session may have changed; `false` when the watch must end (the
    /// client went or the server stops).
    async fn wait(&mut self) -> bool {
        let poll = tokio::time::sleep(POLL);
        tokio::pin!(poll);
        loop {
            tokio::select! {
                signal = self.signal.recv() => match signal {
                    Ok(session) if session == self.session.id() => return true,
                    Ok(_) => {}
                    // Signals were dropped, ours perhaps among them: read again.
                    Err(broadcast::error::RecvError::Lagged(_)) => return true,
                    Err(broadcast::error::RecvError::Closed) => return false,
                },
                () = &mut poll => return true,
                _ = self.stop.changed() => return false,
                () = self.events.closed() => return false,
            }
        }
    }

    /// A read failed. If the session was deleted, the last event is its tombstone and the
    /// stream ends; else the failure's status.
    async fn deleted(&self, error: crate::store::Error) -> Option<Status> {
        let gone = matches!(
            &error,
            crate::store::Error::Domain(crate::domain::Error::NotFound { .. })
        );
        if gone && let Ok(Some(tombstone)) = self.store.tombstone(self.session.id()).await {
            let event = pb::WatchEvent {
                cursor: self.cursor.clone(),
                branch: String::new(),
                event: Some(pb::watch_event::Event::Deleted(
                    super::lifecycle::tombstone(tombstone),
                )),
            };
            // Sent like any event; a client gone or not reading misses only the news.
            let _ = tokio::time::timeout(self.fall_behind, self.events.send(event)).await;
            return None;
        }
        Some(self.failed(error))
    }

    /// A read failed: its status, with the cursor to resume from unless the session is gone.
    fn failed(&self, error: crate::store::Error) -> Status {
        let status = status(error);
        if status.code() == tonic::Code::NotFound {
            return status;
        }
        Status::new(
            status.code(),
            format!(
                "{}; resume with after_cursor {}",
                status.message(),
                self.cursor
            ),
        )
    }

    fn stopping(&self) -> Status {
        Status::unavailable(format!(
            "the server is shutting down; resume on another instance or after it restarts \
             with after_cursor {}",
            self.cursor
        ))
    }
}

/// The response stream: the task's events, then its final status, if any.
struct Events {
    queue: mpsc::Receiver<pb::WatchEvent>,
    ending: Option<oneshot::Receiver<Status>>,
}

impl Stream for Events {
    type Item = Result<pb::WatchEvent, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.queue.poll_recv(cx) {
            Poll::Ready(Some(event)) => return Poll::Ready(Some(Ok(event))),
            Poll::Ready(None) => {}
            Poll::Pending => return Poll::Pending,
        }
        // The task ended; its status (sent before the queue closed) is the stream's last item.
        let Some(ending) = self.ending.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(ending).poll(cx) {
            Poll::Ready(result) => {
                self.ending = None;
                Poll::Ready(result.ok().map(Err))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

fn event(change: Change, cursor: String, pinned: &[NodeId]) -> pb::WatchEvent {
    use pb::watch_event::Event;
    let (branch, event) = match change {
        Change::Node { branch, node } => {
            let is_pinned = pinned.contains(&node.id);
            let mut node = convert::node(node);
            node.pinned = is_pinned;
            (branch.map(|b| b.to_string()), Event::Node(node))
        }
        Change::HeadMoved(b) => (
            Some(b.name.to_string()),
            Event::HeadMoved(convert::branch(b)),
        ),
        Change::BranchCreated(b) => (
            Some(b.name.to_string()),
            Event::BranchCreated(convert::branch(b)),
        ),
        Change::BranchDeleted { name, head } => (
            Some(name.to_string()),
            Event::BranchDeleted(pb::Branch {
                name: name.to_string(),
                head_id: head.map(|h| h.to_string()).unwrap_or_default(),
                ..pb::Branch::default()
            }),
        ),
        Change::Compaction(e) => (
            Some(e.branch.clone()),
            Event::Compaction(super::compaction::event(e)),
        ),
    };
    pb::WatchEvent {
        cursor,
        branch: branch.unwrap_or_default(),
        event: Some(event),
    }
}

/// A cursor as sent: the session and branch it follows (a cursor resumes only that watch)
/// and the position, with ids as text. Serialised as JSON, then base64url, behind a version
/// prefix, so it stays opaque and can change form later.
#[derive(Serialize, Deserialize)]
struct CursorForm {
    #[serde(rename = "s")]
    session: String,
    #[serde(rename = "b", default)]
    branch: String,
    /// Branch → head last reported ("" for none).
    #[serde(rename = "h", default)]
    heads: BTreeMap<String, String>,
    /// Running function → last node of its chain reported ("" for none).
    #[serde(rename = "f", default)]
    functions: BTreeMap<String, String>,
    #[serde(rename = "e", default)]
    events: u64,
}

const CURSOR_VERSION: &str = "w1.";

fn encode(session: SessionId, branch: Option<&BranchName>, position: &Position) -> String {
    let id = |id: &Option<NodeId>| id.map(|id| id.to_string()).unwrap_or_default();
    let form = CursorForm {
        session: session.to_string(),
        branch: branch.map(BranchName::to_string).unwrap_or_default(),
        heads: position
            .heads
            .iter()
            .map(|(name, head)| (name.to_string(), id(head)))
            .collect(),
        functions: position
            .functions
            .iter()
            .map(|(function, last)| (function.to_string(), id(last)))
            .collect(),
        events: position.events,
    };
    let json = serde_json::to_vec(&form).expect("a cursor of strings and numbers serialises");
    format!("{CURSOR_VERSION}{}", URL_SAFE_NO_PAD.encode(json))
}

/// The position `text` (a cursor this server sent) stands for; it must be a cursor of this
/// very watch (the same session and branch).
fn decode(text: &str, session: SessionId, branch: Option<&BranchName>) -> Result<Position, Status> {
    let bad = |why: &str| {
        Status::invalid_argument(format!(
            "after_cursor: {why}; pass the `cursor` of an event this watch sent"
        ))
    };
    let form: CursorForm = text
        .strip_prefix(CURSOR_VERSION)
        .and_then(|b64| URL_SAFE_NO_PAD.decode(b64).ok())
        .and_then(|json| serde_json::from_slice(&json).ok())
        .ok_or_else(|| bad("not a watch cursor"))?;
    if form.session != session.to_string() {
        return Err(bad("is a cursor of another session"));
    }
    if form.branch != branch.map(BranchName::to_string).unwrap_or_default() {
        return Err(bad(&format!(
            "is a cursor of a watch of {}",
            match form.branch.as_str() {
                "" => "every branch".to_owned(),
                name => format!("branch {name:?}"),
            }
        )));
    }
    let node = |text: &str| -> Result<Option<NodeId>, Status> {
        match text {
            "" => Ok(None),
            text => NodeId::parse("after_cursor", text)
                .map(Some)
                .map_err(|_| bad("names a node id that is not a UUID")),
        }
    };
    let mut position = Position {
        events: form.events,
        ..Position::default()
    };
    for (name, head) in &form.heads {
        let name =
            BranchName::parse("after_cursor", name).map_err(|_| bad("names a bad branch"))?;
        if branch.is_some_and(|b| *b != name) {
            return Err(bad("names a branch this watch does not follow"));
        }
        position.heads.insert(name, node(head)?);
    }
    for (function, last) in &form.functions {
        let function = node(function)?.ok_or_else(|| bad("names an empty function id"))?;
        position.functions.insert(function, node(last)?);
    }
    Ok(position)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_belongs_to_its_watch() {
        let session = SessionId::new();
        let main = BranchName::main();
        let mut position = Position {
            events: 3,
            ..Position::default()
        };
        position.heads.insert(main.clone(), Some(NodeId::new()));
        position.functions.insert(NodeId::new(), None);
        let text = encode(session, Some(&main), &position);
        assert_eq!(decode(&text, session, Some(&main)).unwrap(), position);
        for (session, branch) in [(SessionId::new(), Some(&main)), (session, None)] {
            let e = decode(&text, session, branch).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with("after_cursor"), "{}", e.message());
        }
        for junk in ["", "w1.", "w1.!!", "abc", "w1.e30"] {
            let e = decode(junk, session, None).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{junk}");
        }
    }
}
