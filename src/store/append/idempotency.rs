//! Idempotency, one scheme for every keyed write: a retry with the same key must repeat the
//! same request, compared by a BLAKE3 fingerprint computed here, in the store, for session
//! creation (`CreateSession`, `ImportSession`: keys per tenant) and for appends (keys per
//! session) alike.

use std::collections::BTreeMap;

use super::request::{AppendRequest, AppendTarget};
use crate::domain::{Hash, node_hash};

/// The idempotency key of a write that creates a session, and the fingerprint of what it asked
/// for.
#[derive(Debug, Clone)]
pub struct CreationKey {
    pub key: String,
    pub request: Hash,
}

impl CreationKey {
    /// `CreateSession{metadata, idempotency_key}`; `None` without a key.
    pub fn session(key: String, metadata: &BTreeMap<String, String>) -> Option<Self> {
        Self::fingerprinted(key, |h| {
            h.update(b"ctxd/create-session/v1");
            hash_metadata(h, metadata);
        })
    }

    /// `ImportSession{format, metadata, data, idempotency_key}` (`format` as the request's
    /// code); `None` without a key.
    pub fn import(
        key: String,
        format: i32,
        metadata: &BTreeMap<String, String>,
        data: &[u8],
    ) -> Option<Self> {
        Self::fingerprinted(key, |h| {
            h.update(b"ctxd/import-session/v1");
            h.update(&format.to_le_bytes());
            hash_metadata(h, metadata);
            h.update(data);
        })
    }

    fn fingerprinted(key: String, request: impl FnOnce(&mut blake3::Hasher)) -> Option<Self> {
        if key.is_empty() {
            return None;
        }
        let mut hasher = blake3::Hasher::new();
        request(&mut hasher);
        Some(Self {
            key,
            request: Hash(*hasher.finalize().as_bytes()),
        })
    }
}

/// Length-prefixed, in key order: distinct maps never hash alike.
fn hash_metadata(hasher: &mut blake3::Hasher, metadata: &BTreeMap<String, String>) {
    hasher.update(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        for s in [k, v] {
            hasher.update(&(s.len() as u64).to_le_bytes());
            hasher.update(s.as_bytes());
        }
    }
}

/// What an idempotent append's retry must repeat exactly: target, expectation, content and
/// pins. The content counts by node hash (no parent, no scope): the same nodes sent again.
pub(super) fn append_fingerprint(request: &AppendRequest) -> Hash {
    let (target, expected, nodes) = (&request.target, request.expected_head, &request.nodes);
    let mut h = blake3::Hasher::new();
    match target {
        AppendTarget::Branch(name) => h.update(b"b").update(name.as_str().as_bytes()),
        AppendTarget::Function(id) => h.update(b"f").update(id.as_bytes()),
    };
    match expected {
        None => h.update(b"-"),
        Some(None) => h.update(b"0"),
        Some(Some(id)) => h.update(b"1").update(id.as_bytes()),
    };
    for node in nodes {
        h.update(&node_hash(None, None, node).0);
    }
    // Appends without pins keep the fingerprints they always had.
    if !request.pinned.is_empty() {
        h.update(b"p");
        for i in &request.pinned {
            h.update(&(*i as u64).to_le_bytes());
        }
    }
    Hash(*h.finalize().as_bytes())
}
