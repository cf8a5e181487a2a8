//! `ctxd compact`: a summary by the server's summarizer or, with `--text`, the caller's own,
//! committed through PrepareCompaction and CommitSummary.

use super::client::{BranchArgs, Result, output, pretty};
use super::connect::{Conn, call, connect};
use super::{show, summaries};
use crate::proto::json::ToJson;
use crate::proto::pb;

/// `ctxd compact`: the server's summarizer, or with `--text` the caller's summary.
pub(super) async fn compact(
    args: BranchArgs,
    instructions: Option<String>,
    from: Option<String>,
    to: Option<String>,
    text: Option<String>,
    conn: &Conn,
) -> Result<String> {
    let req = pb::CompactRequest {
        session_id: args.session,
        branch: args.branch.unwrap_or_default(),
        budget: args.budget.budget(),
        tokenizer: args.budget.tokenizer(),
        instructions: instructions.unwrap_or_default(),
        from_node_id: from.unwrap_or_default(),
        to_node_id: to.unwrap_or_default(),
        ..Default::default()
    };
    let Some(text) = text else {
        let o = call("Compact", connect(conn).await?.compact(req)).await?;
        return Ok(output(conn, &o, || summaries::outcome(&o)));
    };
    // What `Compact` would have been asked, as a plan to commit the text to.
    let prepare = pb::PrepareCompactionRequest {
        session_id: req.session_id,
        branch: req.branch,
        budget: req.budget,
        tokenizer: req.tokenizer,
        instructions: req.instructions,
        from_node_id: req.from_node_id,
        to_node_id: req.to_node_id,
        ..Default::default()
    };
    compact_with_text(prepare, text, conn).await
}

/// The model a summary committed with `ctxd compact --text` is recorded under.
const CLI_MODEL: &str = "ctxd-cli";

/// `ctxd compact --text`: Prepare, then CommitSummary with the caller's text, so no summarizer
/// is needed. A plan the commit does not apply is cancelled, as `Compact` closes its own, so no
/// open plan is left behind. With `--json`: the outcome's fields, plus `prepare`, the
/// PrepareCompaction response.
async fn compact_with_text(
    req: pb::PrepareCompactionRequest,
    text: String,
    conn: &Conn,
) -> Result<String> {
    let mut client = connect(conn).await?;
    let prepared = call("PrepareCompaction", client.prepare_compaction(req)).await?;
    let outcome = if prepared.needed {
        let commit = pb::CommitSummaryRequest {
            compaction_id: prepared.compaction_id.clone(),
            text,
            model: CLI_MODEL.into(),
        };
        let outcome = call("CommitSummary", client.commit_summary(commit)).await?;
        if !outcome.applied {
            let cancel = pb::CancelCompactionRequest {
                compaction_id: prepared.compaction_id.clone(),
                reason: format!(
                    "ctxd compact --text: not applied ({})",
                    show::reason(outcome.reason)
                ),
            };
            call("CancelCompaction", client.cancel_compaction(cancel)).await?;
        }
        outcome
    } else {
        // What `Compact` answers when there is nothing to do.
        pb::CompactionOutcome {
            applied: false,
            tokens_before: prepared.tokens_before,
            tokens_after: prepared.tokens_before,
            reason: pb::CompactionReason::NotNeeded.into(),
            message: prepared.reason.clone(),
            ..Default::default()
        }
    };
    if conn.json {
        let mut value = outcome.to_json();
        value["prepare"] = prepared.to_json();
        return Ok(pretty(&value));
    }
    Ok(summaries::prepared_outcome(&prepared, &outcome))
}
