//! The SQLite writes of a batch: the rows it plans (`BatchRows`), written by the committer's
//! prepared one-row statements (`CommitterTx`) or, for an import, by multi-row statements on the sqlx
//! writer connection.

use std::collections::{HashMap, HashSet};

use rusqlite::OptionalExtension;
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};

use super::append::AppendOutcome;
use super::batch::AppendTx;
use super::body;
use super::codec::{CODEC_ZSTD, compress};
use super::commit::KnownBlobs;
use super::rows::{self, NodeColumns, NodeRow, hash_from, uuid_from};
use super::{Error, Result};
use crate::domain::{self, BranchName, Hash, NodeContent, NodeId, SessionId};

/// Rows a multi-row statement of an import carries at most: 9 columns a node, well under
/// SQLite's limit of bound parameters per statement.
const ROWS_PER_STATEMENT: usize = 500;

// ---------------------------------------------------------------- the two transactions

// Statement heads shared by the committer's one-row inserts and an import's multi-row ones;
// values bind in the order of the columns. Macros, so `concat!` can build whole statements.
macro_rules! insert_blobs {
    () => {
        "INSERT INTO blobs (hash, size, codec, data) "
    };
}
macro_rules! blob_stored_once {
    () => {
        " ON CONFLICT (hash) DO NOTHING"
    };
}
macro_rules! insert_nodes {
    () => {
        "INSERT INTO nodes (id, session_id, parent_id, function_id, kind, created_at_ms, hash, \
         body, body_z) "
    };
}
macro_rules! insert_functions {
    () => {
        "INSERT INTO functions (id, session_id) "
    };
}

/// The sqlx writer connection, in an import's transaction.
impl AppendTx for SqliteConnection {
    async fn branch_head(
        &mut self,
        session: SessionId,
        name: &BranchName,
    ) -> Result<Option<NodeId>> {
        rows::branch_head(self, session, name).await
    }

    async fn function_row(
        &mut self,
        session: SessionId,
        function: NodeId,
    ) -> Result<(Option<NodeId>, bool)> {
        rows::function_row(self, session, function).await
    }

    async fn node_row(&mut self, session: SessionId, id: NodeId, field: &str) -> Result<NodeRow> {
        rows::node_row(self, session, id, field).await
    }

    async fn ensure_session(&mut self, session: SessionId) -> Result<()> {
        rows::ensure_session(self, session).await
    }

    async fn write(&mut self, pending: &BatchRows) -> Result<()> {
        let mut sql = QueryBuilder::<Sqlite>::new("");
        pending.push_writes(&mut sql);
        sql.build().persistent(false).execute(&mut *self).await?;
        Ok(())
    }
}

/// The committer's transaction on its own connection. Its statements stay prepared: a batch
/// repeats the same dozen.
pub(super) struct CommitterTx<'t>(pub(super) &'t rusqlite::Connection);

fn not_found(what: &'static str, id: impl std::fmt::Display) -> Error {
    domain::Error::not_found(what, id).into()
}

impl CommitterTx<'_> {
    /// The stored record of an idempotency key: the request's fingerprint and the first answer.
    pub(super) fn idempotency_record(
        &self,
        session: SessionId,
        key: &str,
    ) -> Result<Option<(Hash, AppendOutcome)>> {
        let Some((hash, response)): Option<(Vec<u8>, String)> = self
            .0
            .prepare_cached(
                "SELECT request_hash, response FROM idempotency WHERE session_id = ?1 AND key = ?2",
            )?
            .query_row((session.as_bytes().as_slice(), key), |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?
        else {
            return Ok(None);
        };
        let outcome = serde_json::from_str(&response)
            .map_err(|e| Error::Corrupt(format!("idempotency response: {e}")))?;
        Ok(Some((hash_from(&hash, "request_hash")?, outcome)))
    }
}

impl AppendTx for CommitterTx<'_> {
    async fn branch_head(
        &mut self,
        session: SessionId,
        name: &BranchName,
    ) -> Result<Option<NodeId>> {
        let head: Option<Vec<u8>> = self
            .0
            .prepare_cached(rows::BRANCH_HEAD)?
            .query_row((session.as_bytes().as_slice(), name.as_str()), |r| r.get(0))
            .optional()?
            .ok_or_else(|| not_found("branch", name))?;
        Ok(uuid_from(head, "head_id")?.map(NodeId::from_bytes))
    }

    async fn function_row(
        &mut self,
        session: SessionId,
        function: NodeId,
    ) -> Result<(Option<NodeId>, bool)> {
        let (head, closed_by): (Option<Vec<u8>>, Option<Vec<u8>>) = self
            .0
            .prepare_cached(rows::FUNCTION_ROW)?
            .query_row(
                (
                    function.as_bytes().as_slice(),
                    session.as_bytes().as_slice(),
                ),
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?
            .ok_or_else(|| not_found("function", function))?;
        Ok((
            uuid_from(head, "head_id")?.map(NodeId::from_bytes),
            closed_by.is_some(),
        ))
    }

    async fn node_row(&mut self, session: SessionId, id: NodeId, field: &str) -> Result<NodeRow> {
        let columns = self
            .0
            .prepare_cached(rows::NODE_ROW)?
            .query_row(
                (id.as_bytes().as_slice(), session.as_bytes().as_slice()),
                |r| {
                    Ok(NodeColumns {
                        id: r.get(0)?,
                        parent_id: r.get(1)?,
                        function_id: r.get(2)?,
                        created_at_ms: r.get(3)?,
                        hash: r.get(4)?,
                        body: r.get(5)?,
                        body_z: r.get(6)?,
                    })
                },
            )
            .optional()?
            .ok_or_else(|| domain::Error::NotFound {
                what: "node",
                id: format!("{id} ({field})"),
            })?;
        NodeRow::from_columns(columns)
    }

    async fn ensure_session(&mut self, session: SessionId) -> Result<()> {
        self.0
            .prepare_cached(rows::SESSION_EXISTS)?
            .query_row([session.as_bytes().as_slice()], |_| Ok(()))
            .optional()?
            .ok_or_else(|| not_found("session", session))
    }

    /// Row by row: a prepared statement's step costs less than parsing a multi-row one.
    async fn write(&mut self, pending: &BatchRows) -> Result<()> {
        let id = |id: &NodeId| id.as_bytes().to_vec();
        let c = self.0;
        if !pending.blobs.is_empty() {
            let mut insert = c.prepare_cached(concat!(
                insert_blobs!(),
                "VALUES (?, ?, ?, ?)",
                blob_stored_once!()
            ))?;
            for blob in &pending.blobs {
                insert.execute((
                    blob.hash.0.as_slice(),
                    blob.size,
                    blob.codec,
                    blob.data.as_slice(),
                ))?;
            }
        }
        let mut insert = c.prepare_cached(concat!(
            insert_nodes!(),
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        ))?;
        for node in &pending.nodes {
            let n = &node.insert;
            insert.execute((
                id(&n.id),
                n.session.as_bytes().as_slice(),
                n.parent.as_ref().map(id),
                n.function.as_ref().map(id),
                node.kind,
                n.created_at_ms,
                n.hash.0.as_slice(),
                node.body.as_str(),
                node.body_z.as_deref(),
            ))?;
        }
        for (function, session) in &pending.opened {
            c.prepare_cached(concat!(insert_functions!(), "VALUES (?, ?)"))?
                .execute((id(function), session.as_bytes().as_slice()))?;
        }
        for (result, function) in &pending.closes {
            // Another branch may have closed it already; the first result is the record.
            c.prepare_cached(
                "UPDATE functions SET closed_by = ?1 WHERE id = ?2 AND closed_by IS NULL",
            )?
            .execute((id(result), id(function)))?;
        }
        for ((session, name), (head, at)) in &pending.branch_heads {
            c.prepare_cached(
                "UPDATE branches SET head_id = ?1, updated_at_ms = ?2
                 WHERE session_id = ?3 AND name = ?4",
            )?
            .execute((id(head), at, session.as_bytes().as_slice(), name.as_str()))?;
        }
        for (function, head) in &pending.function_heads {
            c.prepare_cached("UPDATE functions SET head_id = ?1 WHERE id = ?2")?
                .execute((id(head), id(function)))?;
        }
        for (session, node, at) in &pending.pins {
            c.prepare_cached(
                "INSERT INTO pins (session_id, node_id, pinned, created_at_ms) VALUES (?1, ?2, 1, ?3)",
            )?
            .execute((session.as_bytes().as_slice(), id(node), at))?;
        }
        for record in &pending.idempotency {
            c.prepare_cached(
                "INSERT INTO idempotency (session_id, key, request_hash, response, created_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute((
                record.session.as_bytes().as_slice(),
                record.key.as_str(),
                record.request_hash.0.as_slice(),
                record.response.as_str(),
                record.created_at_ms,
            ))?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- the rows of a batch

pub(super) struct NodeInsert {
    pub(super) id: NodeId,
    pub(super) session: SessionId,
    pub(super) parent: Option<NodeId>,
    pub(super) function: Option<NodeId>,
    pub(super) created_at_ms: i64,
    pub(super) hash: Hash,
}

struct NodeWrite {
    insert: NodeInsert,
    kind: i64,
    body: String,
    body_z: Option<Vec<u8>>,
}

struct BlobRow {
    hash: Hash,
    size: i64,
    codec: i64,
    data: Vec<u8>,
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
    blobs: Vec<BlobRow>,
    pub(super) blob_hashes: HashSet<Hash>,
    nodes: Vec<NodeWrite>,
    /// Functions opened: (call node, session).
    pub(super) opened: Vec<(NodeId, SessionId)>,
    /// Functions closed, in order (the first result is the record): (result node, function).
    pub(super) closes: Vec<(NodeId, NodeId)>,
    /// New heads of branches, with the time they moved.
    pub(super) branch_heads: HashMap<(SessionId, BranchName), (NodeId, i64)>,
    pub(super) function_heads: HashMap<NodeId, NodeId>,
    /// Nodes pinned as they are appended: (session, node, time).
    pub(super) pins: Vec<(SessionId, NodeId, i64)>,
    pub(super) idempotency: Vec<IdempotencyRow>,
}

impl BatchRows {
    /// Plans a node and the blobs it refers to that are not known to be stored.
    pub(super) fn node(&mut self, known: &KnownBlobs, insert: NodeInsert, content: &NodeContent) {
        let (json, blobs) = body::encode(content);
        for (hash, data) in blobs {
            if known.0.contains(&hash) || !self.blob_hashes.insert(hash) {
                continue;
            }
            let (codec, stored) = compress(data);
            self.blobs.push(BlobRow {
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

    /// An import's writes as multi-row statements, each ending in `; `. An import plans no
    /// idempotency records: those come from appends, which the committer writes.
    fn push_writes(&self, sql: &mut QueryBuilder<Sqlite>) {
        let id = |id: NodeId| id.as_bytes().to_vec();
        for chunk in self.blobs.chunks(ROWS_PER_STATEMENT) {
            sql.push(insert_blobs!());
            sql.push_values(chunk, |mut row, blob| {
                row.push_bind(blob.hash.0.to_vec())
                    .push_bind(blob.size)
                    .push_bind(blob.codec)
                    .push_bind(blob.data.clone());
            });
            sql.push(concat!(blob_stored_once!(), "; "));
        }
        for chunk in self.nodes.chunks(ROWS_PER_STATEMENT) {
            sql.push(insert_nodes!());
            sql.push_values(chunk, |mut row, node| {
                let n = &node.insert;
                row.push_bind(id(n.id))
                    .push_bind(n.session.as_bytes().to_vec())
                    .push_bind(n.parent.map(id))
                    .push_bind(n.function.map(id))
                    .push_bind(node.kind)
                    .push_bind(n.created_at_ms)
                    .push_bind(n.hash.0.to_vec())
                    .push_bind(node.body.clone())
                    .push_bind(node.body_z.clone());
            });
            sql.push("; ");
        }
        for chunk in self.opened.chunks(ROWS_PER_STATEMENT) {
            sql.push(insert_functions!());
            sql.push_values(chunk, |mut row, (function, session)| {
                row.push_bind(id(*function))
                    .push_bind(session.as_bytes().to_vec());
            });
            sql.push("; ");
        }
        for (result, function) in &self.closes {
            // Another branch may have closed it already; the first result is the record.
            sql.push("UPDATE functions SET closed_by = ")
                .push_bind(id(*result))
                .push(" WHERE id = ")
                .push_bind(id(*function))
                .push(" AND closed_by IS NULL; ");
        }
        let branch_heads: Vec<_> = self.branch_heads.iter().collect();
        for chunk in branch_heads.chunks(ROWS_PER_STATEMENT) {
            sql.push("UPDATE branches SET head_id = v.column3, updated_at_ms = v.column4 FROM (");
            sql.push_values(chunk, |mut row, ((session, name), (head, at))| {
                row.push_bind(session.as_bytes().to_vec())
                    .push_bind(name.as_str().to_owned())
                    .push_bind(id(*head))
                    .push_bind(*at);
            });
            sql.push(
                ") AS v WHERE branches.session_id = v.column1 AND branches.name = v.column2; ",
            );
        }
        let function_heads: Vec<_> = self.function_heads.iter().collect();
        for chunk in function_heads.chunks(ROWS_PER_STATEMENT) {
            sql.push("UPDATE functions SET head_id = v.column2 FROM (");
            sql.push_values(chunk, |mut row, (function, head)| {
                row.push_bind(id(**function)).push_bind(id(**head));
            });
            sql.push(") AS v WHERE functions.id = v.column1; ");
        }
    }
}
