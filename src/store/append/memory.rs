//! What the group committer remembers between batches, so a batch on a target it wrote last
//! need not read it again: each append target's state at its head, and the blobs known to be
//! stored. Both are bounded, and start over when full.

use std::collections::{HashMap, HashSet};

use super::batch::FoundTarget;
use super::request::AppendTarget;
use crate::domain::{ChainTail, Hash, NodeId, SessionId};

pub(super) type TargetKey = (SessionId, AppendTarget);

/// What the committer remembers of an append target: its head, the hashes new nodes chain
/// from, and its pairing state. All of it follows from the head, so it is used only while the
/// stored head is still `head`.
#[derive(Clone)]
pub(super) struct TargetState {
    pub(super) head: Option<NodeId>,
    pub(super) head_hash: Option<Hash>,
    pub(super) scope_hash: Option<Hash>,
    pub(super) tail: ChainTail,
}

#[derive(Default)]
pub(super) struct TargetCache(pub(super) HashMap<TargetKey, TargetState>);

/// Targets remembered at most; past that the cache starts over.
const CACHE_TARGETS: usize = 100_000;

/// Blobs known to be stored, by session and hash. A blob goes only when the last session
/// referring to it is deleted, and a deleted session takes no more appends, so a pair once
/// stored stays true; a blob not known here is written with `ON CONFLICT DO NOTHING` all the
/// same.
#[derive(Default)]
pub(super) struct KnownBlobs(pub(super) HashSet<(SessionId, Hash)>);

/// Blobs remembered at most (48 bytes each); past that the set starts over.
const KNOWN_BLOBS: usize = 200_000;

impl TargetCache {
    /// Keeps the targets a committed batch found and left (`seen`), true until something else
    /// moves a head; functions it closed (`closed`, or closed when read) are let go.
    pub(super) fn remember(
        &mut self,
        seen: &HashMap<TargetKey, FoundTarget>,
        closed: &HashSet<(SessionId, NodeId)>,
    ) {
        if self.0.len() + seen.len() > CACHE_TARGETS {
            self.0.clear();
        }
        for (key, found) in seen {
            let closed = match key.1 {
                AppendTarget::Function(f) => found.closed || closed.contains(&(key.0, f)),
                AppendTarget::Branch(_) => false,
            };
            if closed {
                // Nothing more goes into a closed function.
                self.0.remove(key);
            } else {
                self.0.insert(key.clone(), found.state.clone());
            }
        }
    }
}

impl KnownBlobs {
    /// Keeps the blobs a committed batch stored.
    pub(super) fn remember(&mut self, stored: &HashSet<(SessionId, Hash)>) {
        if self.0.len() + stored.len() > KNOWN_BLOBS {
            self.0.clear();
        }
        self.0.extend(stored.iter().copied());
    }
}
