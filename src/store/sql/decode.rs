//! Decoding the store's rows once for every backend: a driver's row reads a column by name as
//! bytes, text or an integer (`Columns`, implemented here for each driver's rows), and these
//! turn columns into ids, hashes, nodes, sessions, branches, pins, summaries, plans and events.

use sqlx::Row as _;
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;

use super::{Error, Result};
use crate::domain::{
    AskedEdit, Branch, BranchName, CompactionEvent, CompactionId, EventKind, GatewayCall,
    GatewayCallId, GatewayUsage, Hash, NodeId, PrefixChange, ProviderUsage, Reason, SessionId,
    Summary, SummaryId, SummaryKind, Tenant, Tombstone,
};
use crate::store::append::request::AppendOutcome;
use crate::store::backend::{BranchStart, SessionRow, StoredBlob};
use crate::store::form::rows::{
    NodeColumns, NodeRow, hash_from, parse_budget, parse_ledger, parse_metadata, u32_from,
    unpack_ids, unpack_summaries, uuid_from,
};
use crate::store::session::compaction::{CompactionPlan, PlanState};

/// A result row, as its driver reads a column (`None`: NULL).
pub(in crate::store) trait Columns {
    fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>>;
    fn text(&self, column: &str) -> Result<Option<String>>;
    fn int(&self, column: &str) -> Result<Option<i64>>;
}

/// Implements [`Columns`] for a driver's row, whose `$get` reads a column by name.
macro_rules! columns_by_name {
    ($($row:ty: $get:ident),*) => {$(
        impl Columns for $row {
            fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>> {
                Ok(self.$get(column)?)
            }

            fn text(&self, column: &str) -> Result<Option<String>> {
                Ok(self.$get(column)?)
            }

            fn int(&self, column: &str) -> Result<Option<i64>> {
                Ok(self.$get(column)?)
            }
        }
    )*};
}

columns_by_name!(SqliteRow: try_get, PgRow: try_get, rusqlite::Row<'_>: get);

fn null(column: &str) -> Error {
    Error::Corrupt(format!("{column} is null"))
}

pub(super) fn req_bytes(row: &impl Columns, column: &str) -> Result<Vec<u8>> {
    row.bytes(column)?.ok_or_else(|| null(column))
}

pub(in crate::store) fn req_text(row: &impl Columns, column: &str) -> Result<String> {
    row.text(column)?.ok_or_else(|| null(column))
}

pub(super) fn req_int(row: &impl Columns, column: &str) -> Result<i64> {
    row.int(column)?.ok_or_else(|| null(column))
}

/// A nullable 16-byte id column (any UUID-keyed id).
pub(in crate::store) fn uuid(row: &impl Columns, column: &str) -> Result<Option<[u8; 16]>> {
    uuid_from(row.bytes(column)?, column)
}

/// A non-null 16-byte id column.
pub(in crate::store) fn req_uuid(row: &impl Columns, column: &str) -> Result<[u8; 16]> {
    uuid(row, column)?.ok_or_else(|| null(column))
}

pub(in crate::store) fn node_id(row: &impl Columns, column: &str) -> Result<Option<NodeId>> {
    Ok(uuid(row, column)?.map(NodeId::from_bytes))
}

pub(in crate::store) fn hash(row: &impl Columns, column: &str) -> Result<Hash> {
    hash_from(&req_bytes(row, column)?, column)
}

fn u32_of(row: &impl Columns, column: &str) -> Result<u32> {
    u32_from(req_int(row, column)?, column)
}

/// The columns [`node`] reads, of nodes as `n`.
macro_rules! node_columns {
    () => {
        "n.id, n.parent_id, n.function_id, n.created_at_ms, n.hash, n.body, n.body_z"
    };
}
pub(in crate::store) use node_columns;

/// A node row: `id, parent_id, function_id, created_at_ms, hash, body, body_z`.
pub(in crate::store) fn node(row: &impl Columns) -> Result<NodeRow> {
    NodeRow::from_columns(NodeColumns {
        id: req_bytes(row, "id")?,
        parent_id: row.bytes("parent_id")?,
        function_id: row.bytes("function_id")?,
        created_at_ms: req_int(row, "created_at_ms")?,
        hash: req_bytes(row, "hash")?,
        body: req_text(row, "body")?,
        body_z: row.bytes("body_z")?,
    })
}

/// `id`: a node's, or a session's.
pub(in crate::store) fn id(row: &impl Columns) -> Result<NodeId> {
    node_id(row, "id")?.ok_or_else(|| Error::Corrupt("a null id".into()))
}

pub(in crate::store) fn session_id(row: &impl Columns) -> Result<SessionId> {
    Ok(SessionId::from_bytes(req_uuid(row, "id")?))
}

/// `head_id, closed_by`: a function's chain head, and whether a result closed it.
pub(in crate::store) fn function(row: &impl Columns) -> Result<(Option<NodeId>, bool)> {
    Ok((
        node_id(row, "head_id")?,
        node_id(row, "closed_by")?.is_some(),
    ))
}

/// `request_hash, response`: an append's idempotency record.
pub(in crate::store) fn idempotency(row: &impl Columns) -> Result<(Hash, AppendOutcome)> {
    let outcome = serde_json::from_str(&req_text(row, "response")?)
        .map_err(|e| Error::Corrupt(format!("idempotency response: {e}")))?;
    Ok((hash(row, "request_hash")?, outcome))
}

/// `request_hash, session_id`: the session a creation key made.
pub(in crate::store) fn session_key(row: &impl Columns) -> Result<(Hash, SessionId)> {
    Ok((
        hash(row, "request_hash")?,
        SessionId::from_bytes(req_uuid(row, "session_id")?),
    ))
}

pub(in crate::store) fn tenant(row: &impl Columns) -> Result<Tenant> {
    Ok(Tenant::new(req_text(row, "tenant")?))
}

/// `session_id, tenant`: whose a compaction plan is.
pub(in crate::store) fn owner(row: &impl Columns) -> Result<(SessionId, Tenant)> {
    Ok((
        SessionId::from_bytes(req_uuid(row, "session_id")?),
        tenant(row)?,
    ))
}

/// `hash, size, codec, data`.
pub(in crate::store) fn blob(row: &impl Columns) -> Result<StoredBlob> {
    Ok(StoredBlob {
        hash: hash(row, "hash")?,
        size: req_int(row, "size")?,
        codec: req_int(row, "codec")?,
        data: req_bytes(row, "data")?,
    })
}

/// A count, as the non-negative number it is.
pub(in crate::store) fn count(row: &impl Columns, column: &str) -> Result<u64> {
    Ok(u64::try_from(req_int(row, column)?).unwrap_or(0))
}

/// The start of a render as its first row tells it (`branch`: the branch's name, NULL when
/// there is no such branch; `head_id`), before its summaries and pins are read.
pub(in crate::store) fn branch_start(row: &impl Columns) -> Result<BranchStart> {
    if row.text("branch")?.is_none() {
        return Ok(BranchStart::NoBranch);
    }
    Ok(match node_id(row, "head_id")? {
        None => BranchStart::Empty,
        Some(head) => BranchStart::At {
            head,
            summaries: Vec::new(),
            pin_events: Vec::new(),
        },
    })
}

/// `id, created_at_ms, metadata, compaction_count`.
pub(in crate::store) fn session(row: &impl Columns) -> Result<SessionRow> {
    Ok(SessionRow {
        id: SessionId::from_bytes(req_uuid(row, "id")?),
        created_at_ms: req_int(row, "created_at_ms")?,
        metadata: parse_metadata(&req_text(row, "metadata")?)?,
        compaction_count: u32::try_from(req_int(row, "compaction_count")?).unwrap_or(u32::MAX),
    })
}

/// `name, head_id, updated_at_ms` and the head's `hash`.
pub(in crate::store) fn branch(row: &impl Columns) -> Result<Branch> {
    let head = match node_id(row, "head_id")? {
        Some(id) => Some((id, hash(row, "hash")?)),
        None => None,
    };
    Ok(Branch {
        name: BranchName::from_stored(req_text(row, "name")?),
        head,
        updated_at_ms: req_int(row, "updated_at_ms")?,
    })
}

/// `node_id, pinned`.
pub(in crate::store) fn pin(row: &impl Columns) -> Result<(NodeId, bool)> {
    let node = node_id(row, "node_id")?.ok_or_else(|| null("node_id"))?;
    Ok((node, req_int(row, "pinned")? != 0))
}

fn kind(row: &impl Columns) -> Result<SummaryKind> {
    let kind = req_text(row, "kind")?;
    SummaryKind::parse(&kind).ok_or_else(|| Error::Corrupt(format!("summary kind {kind:?}")))
}

pub(in crate::store) fn reason(row: &impl Columns) -> Result<Option<Reason>> {
    row.text("reason")?
        .map(|r| Reason::parse(&r).ok_or_else(|| Error::Corrupt(format!("event reason {r:?}"))))
        .transpose()
}

fn range(row: &impl Columns) -> Result<Option<(NodeId, NodeId)>> {
    Ok(node_id(row, "range_from_id")?.zip(node_id(row, "range_to_id")?))
}

/// The columns [`summary`] reads.
macro_rules! summary_columns {
    () => {
        "id, compaction_id, kind, covers, range_from_id, range_to_id, text, rolls_over, ledger, \
         model, base_head_id, tokens_before, tokens_after, created_at_ms"
    };
}
pub(in crate::store) use summary_columns;

pub(in crate::store) fn summary(row: &impl Columns) -> Result<Summary> {
    Ok(Summary {
        id: SummaryId::from_bytes(req_uuid(row, "id")?),
        compaction_id: CompactionId::from_bytes(req_uuid(row, "compaction_id")?),
        kind: kind(row)?,
        covers: unpack_ids(&req_bytes(row, "covers")?)?,
        range: range(row)?,
        text: req_text(row, "text")?,
        rolls_over: unpack_summaries(row.bytes("rolls_over")?)?,
        ledger: parse_ledger(row.text("ledger")?)?.map(std::sync::Arc::new),
        model: req_text(row, "model")?,
        base_head: NodeId::from_bytes(req_uuid(row, "base_head_id")?),
        tokens_before: u32_of(row, "tokens_before")?,
        tokens_after: u32_of(row, "tokens_after")?,
        created_at_ms: req_int(row, "created_at_ms")?,
    })
}

pub(in crate::store) fn plan(id: CompactionId, row: &impl Columns) -> Result<CompactionPlan> {
    let state = req_text(row, "state")?;
    Ok(CompactionPlan {
        id,
        session: SessionId::from_bytes(req_uuid(row, "session_id")?),
        branch: BranchName::from_stored(req_text(row, "branch")?),
        base_head: NodeId::from_bytes(req_uuid(row, "base_head_id")?),
        kind: kind(row)?,
        rolls_over: unpack_summaries(row.bytes("rolls_over")?)?,
        covers: unpack_ids(&req_bytes(row, "covers")?)?,
        range: range(row)?,
        ledger: parse_ledger(row.text("ledger")?)?.unwrap_or_default(),
        budget: parse_budget(&req_text(row, "budget")?)?,
        tokenizer: req_text(row, "tokenizer")?,
        max_tool_result_chars: u32_of(row, "max_tool_result_chars")?,
        retain_turns: u32_of(row, "retain_turns")?,
        instructions: req_text(row, "instructions")?,
        tokens_before: u32_of(row, "tokens_before")?,
        state: PlanState::parse(&state)
            .ok_or_else(|| Error::Corrupt(format!("compaction state {state:?}")))?,
        created_at_ms: req_int(row, "created_at_ms")?,
    })
}

pub(in crate::store) fn event(row: &impl Columns) -> Result<CompactionEvent> {
    let kind = req_text(row, "kind")?;
    Ok(CompactionEvent {
        compaction_id: CompactionId::from_bytes(req_uuid(row, "compaction_id")?),
        branch: req_text(row, "branch")?,
        kind: EventKind::parse(&kind)
            .ok_or_else(|| Error::Corrupt(format!("event kind {kind:?}")))?,
        reason: reason(row)?,
        base_head: node_id(row, "base_head_id")?,
        tokens_before: u32_of(row, "tokens_before")?,
        tokens_after: u32_of(row, "tokens_after")?,
        summary_id: uuid(row, "summary_id")?.map(SummaryId::from_bytes),
        message: req_text(row, "message")?,
        created_at_ms: req_int(row, "created_at_ms")?,
    })
}

/// The columns [`tombstone`] reads, of tombstones as `t`.
macro_rules! tombstone_columns {
    () => {
        "t.session_id, t.tenant, t.deleted_by, t.deleted_at_ms, t.nodes, t.branches, t.summaries"
    };
}
pub(in crate::store) use tombstone_columns;

pub(in crate::store) fn tombstone(row: &impl Columns) -> Result<Tombstone> {
    Ok(Tombstone {
        session: SessionId::from_bytes(req_uuid(row, "session_id")?),
        tenant: Tenant::new(req_text(row, "tenant")?),
        deleted_by: req_text(row, "deleted_by")?,
        deleted_at_ms: req_int(row, "deleted_at_ms")?,
        nodes: u64::try_from(req_int(row, "nodes")?).unwrap_or(0),
        branches: u32_of(row, "branches")?,
        summaries: u32_of(row, "summaries")?,
    })
}

/// The columns of one gateway call, as [`gateway_call`] reads them.
macro_rules! gateway_call_columns {
    () => {
        "id, at_ms, api, model, client_tokens, forwarded_tokens, input_tokens, \
         cache_read_tokens, cache_write_tokens, output_tokens, kept_tokens, change, priced_by, \
         edit_clear, edit_keep, provider_cleared, provider_cleared_tokens, \
         provider_thinking_dropped, thinking_dropped"
    };
}
pub(in crate::store) use gateway_call_columns;

/// One gateway call ([`gateway_call_columns`]) with its id. A stored `change` this build cannot
/// read is corrupt, as an unknown event reason is.
pub(in crate::store) fn gateway_call(row: &impl Columns) -> Result<(GatewayCallId, GatewayCall)> {
    // Counts are stored from u64 saturated at i64::MAX: a negative one was never written.
    let n = |column: &str| -> Result<u64> {
        let v = req_int(row, column)?;
        u64::try_from(v).map_err(|_| Error::Corrupt(format!("{column} is {v}")))
    };
    let change = row
        .text("change")?
        .map(|c| {
            PrefixChange::parse(&c).ok_or_else(|| Error::Corrupt(format!("gateway change {c:?}")))
        })
        .transpose()?;
    // A count stored as a u32 (NULL where none was): a negative or larger one is corrupt.
    let small = |column: &str| -> Result<Option<u32>> {
        row.int(column)?
            .map(|v| u32::try_from(v).map_err(|_| Error::Corrupt(format!("{column} is {v}"))))
            .transpose()
    };
    let mut call = GatewayCall {
        at_ms: req_int(row, "at_ms")?,
        api: req_text(row, "api")?,
        model: req_text(row, "model")?,
        client_tokens: n("client_tokens")?,
        forwarded_tokens: n("forwarded_tokens")?,
        usage: provider_usage(
            &n,
            [
                "input_tokens",
                "cache_read_tokens",
                "cache_write_tokens",
                "output_tokens",
            ],
        )?,
        kept_tokens: n("kept_tokens")?,
        change,
        priced_by: row.text("priced_by")?.unwrap_or_default(),
        asked: match (small("edit_clear")?, small("edit_keep")?) {
            (Some(clear), Some(keep)) => Some(AskedEdit { clear, keep }),
            _ => None,
        },
        thinking_dropped: small("thinking_dropped")?.unwrap_or(0),
    };
    call.usage.cleared = match (
        small("provider_cleared")?,
        row.int("provider_cleared_tokens")?,
    ) {
        (Some(uses), tokens) => Some((
            uses,
            tokens.and_then(|t| u64::try_from(t).ok()).unwrap_or(0),
        )),
        (None, _) => None,
    };
    call.usage.thinking_dropped = small("provider_thinking_dropped")?.unwrap_or(0);
    Ok((GatewayCallId::from_bytes(req_uuid(row, "id")?), call))
}

/// A session's gateway calls added up (`calls`, `client`, `forwarded`, `input`, `cache_read`,
/// `cache_write`, `output`; a sum over no rows is NULL, read as 0).
pub(in crate::store) fn gateway_usage(row: &impl Columns) -> Result<GatewayUsage> {
    let n = |column: &str| -> Result<u64> {
        Ok(row
            .int(column)?
            .and_then(|v| u64::try_from(v).ok())
            .unwrap_or(0))
    };
    Ok(GatewayUsage {
        calls: n("calls")?,
        client_tokens: n("client")?,
        forwarded_tokens: n("forwarded")?,
        usage: provider_usage(&n, ["input", "cache_read", "cache_write", "output"])?,
    })
}

/// A provider's counts (input, cache read, cache write, output), each of `columns` as `n` reads
/// it.
fn provider_usage(
    n: &dyn Fn(&str) -> Result<u64>,
    [input, cache_read, cache_write, output]: [&str; 4],
) -> Result<ProviderUsage> {
    Ok(ProviderUsage {
        input: n(input)?,
        cache_read: n(cache_read)?,
        cache_write: n(cache_write)?,
        output: n(output)?,
        ..ProviderUsage::default()
    })
}
