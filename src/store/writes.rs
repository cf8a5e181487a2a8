//! The rows an append batch plans (`BatchRows`), in backend-neutral form: node bodies encoded
//! and compressed, blobs deduplicated against those known to be stored. A backend writes them
//! (`AppendTx::write_rows`) in the order their references need.

use std::collections::{HashMap, HashSet};

use super::body;
use super::codec::{CODEC_ZSTD, compress};
use super::commit::KnownBlobs;
use crate::domain::{BranchName, Hash, NodeContent, NodeId, SessionId};

pub(super) struct NodeInsert {
    pub(super) id: NodeId,
    pub(super) session: SessionId,
    pub(super) parent: Option<NodeId>,
    pub(super) function: Option<NodeId>,
    pub(super) created_at_ms: i64,
    pub(super) hash: Hash,
}

pub(super) struct NodeWrite {
    pub(super) insert: NodeInsert,
    pub(super) kind: i64,
    pub(super) body: String,
    pub(super) body_z: Option<Vec<u8>>,
}

pub(super) struct BlobRow {
    /// Blobs are stored per session where the engine spreads sessions apart (PostgreSQL); an
    /// engine on one file may store each once for all (SQLite).
    pub(super) session: SessionId,
    pub(super) hash: Hash,
    pub(super) size: i64,
    pub(super) codec: i64,
    pub(super) data: Vec<u8>,
}

pub(super) struct IdempotencyRow {
    pub(super) session: SessionId,
    pub(super) key: String,
    pub(super) request_hash: Hash,
    pub(super) response: String,
    pub(super) created_at_ms: i64,
}

/// The rows a batch writes, in the order their references need: blobs, nodes, functions
/// opened, functions closed, heads, idempotency records.
#[derive(Default)]
pub(super) struct BatchRows {
    pub(super) blobs: Vec<BlobRow>,
    pub(super) blob_hashes: HashSet<(SessionId, Hash)>,
    pub(super) nodes: Vec<NodeWrite>,
    /// Functions opened: (call node, session).
    pub(super) opened: Vec<(NodeId, SessionId)>,
    /// Functions closed, in order (the first result is the record): (session, result node,
    /// function).
    pub(super) closes: Vec<(SessionId, NodeId, NodeId)>,
    /// New heads of branches, with the time they moved.
    pub(super) branch_heads: HashMap<(SessionId, BranchName), (NodeId, i64)>,
    /// New heads of functions: (session, function) → head.
    pub(super) function_heads: HashMap<(SessionId, NodeId), NodeId>,
    /// Nodes pinned as they are appended: (session, node, time).
    pub(super) pins: Vec<(SessionId, NodeId, i64)>,
    pub(super) idempotency: Vec<IdempotencyRow>,
}

impl BatchRows {
    /// Plans a node and the blobs it refers to that are not known to be stored.
    pub(super) fn node(&mut self, known: &KnownBlobs, insert: NodeInsert, content: &NodeContent) {
        let (json, blobs) = body::encode(content);
        for (hash, data) in blobs {
            let key = (insert.session, hash);
            if known.0.contains(&key) || !self.blob_hashes.insert(key) {
                continue;
            }
            let (codec, stored) = compress(data);
            self.blobs.push(BlobRow {
                session: insert.session,
                hash,
                size: i64::try_from(data.len()).unwrap_or(i64::MAX),
                codec,
                data: stored.into_owned(),
            });
        }
        // Long bodies hold tool-call arguments (whole files, for an editor's tools): compress them.
        let (body, body_z) = match compress(json.as_bytes()) {
            (CODEC_ZSTD, packed) => (String::new(), Some(packed.into_owned())),
            _ => (json, None),
        };
        self.nodes.push(NodeWrite {
            insert,
            kind: body::kind_code(content.kind()),
            body,
            body_z,
        });
    }
}
