//! The rows an append batch plans (`BatchRows`), in backend-neutral form: node bodies encoded
//! and compressed, blobs deduplicated against those known to be stored. A backend writes them
//! (`AppendTx::write_rows`) in the order their references need.

use std::collections::{HashMap, HashSet};

use super::memory::KnownBlobs;
use crate::domain::{BranchName, Hash, NodeContent, NodeId, SessionId};
use crate::store::form::body;
use crate::store::form::codec::{CODEC_ZSTD, compress};

pub(in crate::store) struct NodeInsert {
    pub(in crate::store) id: NodeId,
    pub(in crate::store) session: SessionId,
    pub(in crate::store) parent: Option<NodeId>,
    pub(in crate::store) function: Option<NodeId>,
    pub(in crate::store) created_at_ms: i64,
    pub(in crate::store) hash: Hash,
}

pub(in crate::store) struct NodeWrite {
    pub(in crate::store) insert: NodeInsert,
    pub(in crate::store) kind: i64,
    pub(in crate::store) body: String,
    pub(in crate::store) body_z: Option<Vec<u8>>,
}

pub(in crate::store) struct BlobRow {
    /// Blobs are stored per session where the engine spreads sessions apart (PostgreSQL); an
    /// engine on one file may store each once for all (SQLite).
    pub(in crate::store) session: SessionId,
    pub(in crate::store) hash: Hash,
    pub(in crate::store) size: i64,
    pub(in crate::store) codec: i64,
    pub(in crate::store) data: Vec<u8>,
}

pub(in crate::store) struct IdempotencyRow {
    pub(in crate::store) session: SessionId,
    pub(in crate::store) key: String,
    pub(in crate::store) request_hash: Hash,
    pub(in crate::store) response: String,
    pub(in crate::store) created_at_ms: i64,
}

/// The rows a batch writes, in the order their references need: blobs, nodes, functions
/// opened, functions closed, heads, idempotency records.
#[derive(Default)]
pub(in crate::store) struct BatchRows {
    pub(in crate::store) blobs: Vec<BlobRow>,
    pub(in crate::store) blob_hashes: HashSet<(SessionId, Hash)>,
    pub(in crate::store) nodes: Vec<NodeWrite>,
    /// Functions opened: (call node, session).
    pub(in crate::store) opened: Vec<(NodeId, SessionId)>,
    /// Functions closed, in order (the first result is the record): (session, result node,
    /// function).
    pub(in crate::store) closes: Vec<(SessionId, NodeId, NodeId)>,
    /// New heads of branches, with the time they moved.
    pub(in crate::store) branch_heads: HashMap<(SessionId, BranchName), (NodeId, i64)>,
    /// New heads of functions: (session, function) → head.
    pub(in crate::store) function_heads: HashMap<(SessionId, NodeId), NodeId>,
    /// Nodes pinned as they are appended: (session, node, time).
    pub(in crate::store) pins: Vec<(SessionId, NodeId, i64)>,
    pub(in crate::store) idempotency: Vec<IdempotencyRow>,
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
