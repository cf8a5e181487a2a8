//! Stored forms every backend shares: node rows (`NodeRow`, decoded from their columns), 16-byte
//! ids, 32-byte hashes, packed id lists, and the JSON of ledgers, budgets and metadata.

use std::collections::BTreeMap;

use super::codec::unpack_body;
use super::{Error, Result};
use crate::domain::{Budget, Hash, Ledger, NodeId, SummaryId};

pub(in crate::store) struct NodeRow {
    pub(in crate::store) id: NodeId,
    pub(in crate::store) parent_id: Option<NodeId>,
    pub(in crate::store) function_id: Option<NodeId>,
    pub(in crate::store) created_at_ms: i64,
    pub(in crate::store) hash: Hash,
    pub(in crate::store) body: String,
}

/// A node row's columns as read, by any driver.
pub(in crate::store) struct NodeColumns {
    pub(in crate::store) id: Vec<u8>,
    pub(in crate::store) parent_id: Option<Vec<u8>>,
    pub(in crate::store) function_id: Option<Vec<u8>>,
    pub(in crate::store) created_at_ms: i64,
    pub(in crate::store) hash: Vec<u8>,
    pub(in crate::store) body: String,
    pub(in crate::store) body_z: Option<Vec<u8>>,
}

impl NodeRow {
    pub(in crate::store) fn from_columns(c: NodeColumns) -> Result<Self> {
        let id = |bytes, column| Ok::<_, Error>(uuid_from(bytes, column)?.map(NodeId::from_bytes));
        Ok(NodeRow {
            id: id(Some(c.id), "id")?.ok_or_else(|| Error::Corrupt("node without id".into()))?,
            parent_id: id(c.parent_id, "parent_id")?,
            function_id: id(c.function_id, "function_id")?,
            created_at_ms: c.created_at_ms,
            hash: hash_from(&c.hash, "hash")?,
            body: match c.body_z {
                Some(packed) => unpack_body(&packed)?,
                None => c.body,
            },
        })
    }
}

/// The value of a nullable 16-byte id column (any UUID-keyed id).
pub(in crate::store) fn uuid_from(
    bytes: Option<Vec<u8>>,
    column: &str,
) -> Result<Option<[u8; 16]>> {
    bytes
        .map(|b| {
            <[u8; 16]>::try_from(b.as_slice())
                .map_err(|_| Error::Corrupt(format!("{column} is not 16 bytes")))
        })
        .transpose()
}

/// The value of a 32-byte hash column.
pub(in crate::store) fn hash_from(bytes: &[u8], column: &str) -> Result<Hash> {
    <[u8; 32]>::try_from(bytes)
        .map(Hash)
        .map_err(|_| Error::Corrupt(format!("{column} is not 32 bytes")))
}

pub(in crate::store) fn u32_from(n: i64, column: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Corrupt(format!("{column} out of range")))
}

/// Node ids packed end to end (a summary's or plan's `covers`).
pub(in crate::store) fn pack_ids(ids: &[NodeId]) -> Vec<u8> {
    ids.iter().flat_map(|id| *id.as_bytes()).collect()
}

pub(in crate::store) fn unpack_ids(bytes: &[u8]) -> Result<Vec<NodeId>> {
    if !bytes.len().is_multiple_of(16) {
        return Err(Error::Corrupt("packed ids are not 16-byte aligned".into()));
    }
    Ok(bytes
        .chunks_exact(16)
        .map(|c| {
            let mut id = [0u8; 16];
            id.copy_from_slice(c);
            NodeId::from_bytes(id)
        })
        .collect())
}

/// Summary ids packed end to end; `None` for none.
pub(in crate::store) fn pack_summaries(ids: &[SummaryId]) -> Option<Vec<u8>> {
    (!ids.is_empty()).then(|| ids.iter().flat_map(|id| *id.as_bytes()).collect())
}

pub(in crate::store) fn unpack_summaries(bytes: Option<Vec<u8>>) -> Result<Vec<SummaryId>> {
    Ok(unpack_ids(&bytes.unwrap_or_default())?
        .into_iter()
        .map(|id| SummaryId::from_bytes(*id.as_bytes()))
        .collect())
}

pub(in crate::store) fn ledger_json(ledger: &Ledger) -> String {
    serde_json::to_string(ledger).expect("a ledger serializes")
}

pub(in crate::store) fn parse_ledger(json: Option<String>) -> Result<Option<Ledger>> {
    json.map(|j| serde_json::from_str(&j).map_err(|e| Error::Corrupt(format!("ledger: {e}"))))
        .transpose()
}

pub(in crate::store) fn budget_json(b: &Budget) -> String {
    serde_json::to_string(&[
        b.context_window,
        b.output_reserve,
        b.system,
        b.tools,
        b.schema,
    ])
    .expect("numbers serialize")
}

pub(in crate::store) fn parse_budget(json: &str) -> Result<Budget> {
    let [context_window, output_reserve, system, tools, schema]: [u32; 5] =
        serde_json::from_str(json).map_err(|e| Error::Corrupt(format!("budget: {e}")))?;
    Ok(Budget {
        context_window,
        output_reserve,
        system,
        tools,
        schema,
    })
}

pub(in crate::store) fn metadata_json(metadata: &BTreeMap<String, String>) -> String {
    serde_json::to_string(metadata).expect("a string map serializes")
}

pub(in crate::store) fn parse_metadata(json: &str) -> Result<BTreeMap<String, String>> {
    serde_json::from_str(json).map_err(|e| Error::Corrupt(format!("session metadata: {e}")))
}
