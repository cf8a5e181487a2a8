//! A conversation an agent compacted: Claude Code's, which opens with the agent's summary, and
//! Codex's window after a remote compaction; each continues the branch its summary replaced.

use std::collections::HashSet;

use super::prefix::{Against, Fork, extend_as, with_heads};
use super::{AgentSummary, Plan, Unrecorded, owned, store_error};
use crate::domain::{BranchName, Hash, NodeId};
use crate::provider::agents::{
    CLAUDE_CODE_MODEL, CODEX_MODEL, CODEX_TEXT, ends_on_summary_answer, is_agent_summary_of,
    is_codex_trigger,
};
use crate::store::PathTarget;

/// A conversation that opens with the agent's summary of an earlier one (its compaction), in
/// its first `opening` messages: it continues the branch whose history the summary replaced.
/// Where that summary is laid over a branch already, the conversation goes on after what it
/// covers; else the branch that ends on the answer to the agent's summary request (the newest,
/// if several) takes it, and the summary is to be laid over that branch's history. `None`: no
/// such branch.
pub(super) async fn continuation(
    h: &Against<'_>,
    (opening, text): (usize, String),
) -> Result<Option<Plan>, Unrecorded> {
    let (store, session, branches, contents) = (h.store, h.session, h.branches, h.contents);
    let order = with_heads(branches);
    let mut newest: Option<(i64, BranchName, (NodeId, Hash), NodeId)> = None;
    for branch in order {
        let path = store
            .load_path(session, &PathTarget::Branch(branch.name.clone()))
            .await
            .map_err(store_error)?;
        if let Some(summary) = path
            .summaries
            .iter()
            .rev()
            .find(|s| is_agent_summary_of(s, &text))
        {
            let covered: HashSet<NodeId> = summary.covers.iter().copied().collect();
            if let Some(end) = path.nodes.iter().rposition(|n| covered.contains(&n.id)) {
                let node = path.nodes[end].id;
                return extend_as(h, node, opening, Fork::Create).await.map(Some);
            }
        }
        if !ends_on_summary_answer(&path.nodes) {
            continue;
        }
        let (Some(head), Some(first)) = (
            path.nodes.last(),
            path.nodes.iter().find(|n| n.function_id.is_none()),
        ) else {
            continue;
        };
        if newest.as_ref().is_none_or(|n| head.created_at_ms > n.0) {
            newest = Some((
                head.created_at_ms,
                branch.name.clone(),
                (head.id, head.hash),
                first.id,
            ));
        }
    }
    Ok(newest.map(|(_, branch, head, first)| Plan {
        branch,
        function: None,
        expected: Some(head),
        rest: owned(&contents[opening..]),
        behind: false,
        agent_summary: Some(AgentSummary {
            text,
            from: first,
            to: head.0,
            model: CLAUDE_CODE_MODEL,
        }),
    }))
}

/// A Codex window after a remote compaction: the items Codex kept, then its `compaction` item
/// (at `c`), then what is new. It continues the branch where that item answered a
/// `compaction_trigger`: after the window already laid there (an overlay under the answer, which
/// renders nothing, since the window's own item carries the summary), or, the first time, all of
/// the window after the answer, with that overlay to lay. `None`: no branch holds the answer.
pub(super) async fn codex_window(h: &Against<'_>, c: usize) -> Result<Option<Plan>, Unrecorded> {
    let (store, session, branches, contents) = (h.store, h.session, h.branches, h.contents);
    let order = with_heads(branches);
    for branch in order {
        let path = store
            .load_path(session, &PathTarget::Branch(branch.name.clone()))
            .await
            .map_err(store_error)?;
        for x in 1..path.nodes.len() {
            let node = &path.nodes[x];
            if node.function_id.is_some()
                || node.content != *contents[c]
                || !is_codex_trigger(&path.nodes[x - 1].content)
            {
                continue;
            }
            let laid = path
                .summaries
                .iter()
                .any(|s| s.renders_nothing() && s.covers.contains(&node.id));
            if laid {
                return extend_as(h, node.id, 0, Fork::Create).await.map(Some);
            }
            if x + 1 < path.nodes.len() {
                continue;
            }
            let Some(first) = path.nodes.iter().find(|n| n.function_id.is_none()) else {
                continue;
            };
            return Ok(Some(Plan {
                branch: branch.name.clone(),
                function: None,
                expected: Some((node.id, node.hash)),
                rest: owned(contents),
                behind: false,
                agent_summary: Some(AgentSummary {
                    text: CODEX_TEXT.to_owned(),
                    from: first.id,
                    to: node.id,
                    model: CODEX_MODEL,
                }),
            }));
        }
    }
    Ok(None)
}
