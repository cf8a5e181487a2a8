//! Rows: decoding id, hash and node columns (`NodeRow`), and the one-row lookups (session,
//! branch head, function, node) whose statements both the sqlx connections and the committer run.

use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use super::codec::unpack_body;
use super::{Error, Result};
use crate::domain::{self, BranchName, Hash, NodeId, SessionId};

pub(super) struct NodeRow {
    pub(super) id: NodeId,
    pub(super) parent_id: Option<NodeId>,
    pub(super) function_id: Option<NodeId>,
    pub(super) created_at_ms: i64,
    pub(super) hash: Hash,
    pub(super) body: String,
}

pub(super) const NODE_COLUMNS: &str =
    "n.id, n.parent_id, n.function_id, n.created_at_ms, n.hash, n.body, n.body_z";

/// A nullable 16-byte id column (any UUID-keyed id).
pub(super) fn uuid_column(row: &SqliteRow, column: &str) -> Result<Option<[u8; 16]>> {
    uuid_from(row.try_get(column)?, column)
}

/// The value of a nullable 16-byte id column, however it was read.
pub(super) fn uuid_from(bytes: Option<Vec<u8>>, column: &str) -> Result<Option<[u8; 16]>> {
    bytes
        .map(|b| {
            <[u8; 16]>::try_from(b.as_slice())
                .map_err(|_| Error::Corrupt(format!("{column} is not 16 bytes")))
        })
        .transpose()
}

/// A non-null 16-byte id column.
pub(super) fn required_uuid(row: &SqliteRow, column: &str) -> Result<[u8; 16]> {
    uuid_column(row, column)?.ok_or_else(|| Error::Corrupt(format!("{column} is null")))
}

pub(super) fn id_column(row: &SqliteRow, column: &str) -> Result<Option<NodeId>> {
    Ok(uuid_column(row, column)?.map(NodeId::from_bytes))
}

pub(super) fn hash_column(row: &SqliteRow, column: &str) -> Result<Hash> {
    hash_from(&row.try_get::<Vec<u8>, _>(column)?, column)
}

/// The value of a 32-byte hash column, however it was read.
pub(super) fn hash_from(bytes: &[u8], column: &str) -> Result<Hash> {
    <[u8; 32]>::try_from(bytes)
        .map(Hash)
        .map_err(|_| Error::Corrupt(format!("{column} is not 32 bytes")))
}

pub(super) fn node_row_from(row: &SqliteRow) -> Result<NodeRow> {
    NodeRow::from_columns(NodeColumns {
        id: row.try_get("id")?,
        parent_id: row.try_get("parent_id")?,
        function_id: row.try_get("function_id")?,
        created_at_ms: row.try_get("created_at_ms")?,
        hash: row.try_get("hash")?,
        body: row.try_get("body")?,
        body_z: row.try_get("body_z")?,
    })
}

/// A node row's columns ([`NODE_COLUMNS`]) as read, by sqlx or by the committer's connection.
pub(super) struct NodeColumns {
    pub(super) id: Vec<u8>,
    pub(super) parent_id: Option<Vec<u8>>,
    pub(super) function_id: Option<Vec<u8>>,
    pub(super) created_at_ms: i64,
    pub(super) hash: Vec<u8>,
    pub(super) body: String,
    pub(super) body_z: Option<Vec<u8>>,
}

impl NodeRow {
    pub(super) fn from_columns(c: NodeColumns) -> Result<Self> {
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

/// The statements both the sqlx connections and the committer's run (`?` binds in order in both).
pub(super) const SESSION_EXISTS: &str = "SELECT 1 FROM sessions WHERE id = ?";
pub(super) const BRANCH_HEAD: &str =
    "SELECT head_id FROM branches WHERE session_id = ? AND name = ?";
pub(super) const FUNCTION_ROW: &str =
    "SELECT head_id, closed_by FROM functions WHERE id = ? AND session_id = ?";
pub(super) const NODE_ROW: &str =
    "SELECT n.id, n.parent_id, n.function_id, n.created_at_ms, n.hash, n.body,
    n.body_z FROM nodes n WHERE n.id = ? AND n.session_id = ?";

pub(super) async fn ensure_session(conn: &mut SqliteConnection, session: SessionId) -> Result<()> {
    sqlx::query(SESSION_EXISTS)
        .bind(session.as_bytes().as_slice())
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| domain::Error::not_found("session", session))?;
    Ok(())
}

pub(super) async fn branch_head(
    conn: &mut SqliteConnection,
    session: SessionId,
    name: &BranchName,
) -> Result<Option<NodeId>> {
    let row = sqlx::query(BRANCH_HEAD)
        .bind(session.as_bytes().as_slice())
        .bind(name.as_str())
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| domain::Error::not_found("branch", name))?;
    id_column(&row, "head_id")
}

/// A function's chain head and whether it is closed.
pub(super) async fn function_row(
    conn: &mut SqliteConnection,
    session: SessionId,
    function: NodeId,
) -> Result<(Option<NodeId>, bool)> {
    let row = sqlx::query(FUNCTION_ROW)
        .bind(function.as_bytes().as_slice())
        .bind(session.as_bytes().as_slice())
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| domain::Error::not_found("function", function))?;
    Ok((
        id_column(&row, "head_id")?,
        id_column(&row, "closed_by")?.is_some(),
    ))
}

/// One node of `session`; `field` names the request field in the not-found error.
pub(super) async fn node_row(
    conn: &mut SqliteConnection,
    session: SessionId,
    id: NodeId,
    field: &str,
) -> Result<NodeRow> {
    let row = sqlx::query(NODE_ROW)
        .bind(id.as_bytes().as_slice())
        .bind(session.as_bytes().as_slice())
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| domain::Error::NotFound {
            what: "node",
            id: format!("{id} ({field})"),
        })?;
    node_row_from(&row)
}
