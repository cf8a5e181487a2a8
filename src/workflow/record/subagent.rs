//! Sub-agents: a conversation that opens with the prompt of a sub-agent call is that call's
//! function, and the tool result that answers the call closes it (or, for a call that runs in
//! the background, reports its launch while the function runs on).

use super::prefix::{chain_hashes, stored_prefix, with_heads};
use super::{Plan, RETRY, Unrecorded, owned, store_error};
use crate::domain::{self, BranchName, NodeContent, NodeId, Part};
use crate::provider::agents::{AGENT_TOOLS, agent_call};
use crate::store::{self, AppendRequest, AppendTarget, PathTarget, Scoped, Store};

/// The sub-agent calls of a path's latest message: those a function took up and has not closed
/// (call id and function), and those that run in the background.
#[derive(Debug, Default)]
pub(super) struct Calls {
    open: Vec<(String, NodeId)>,
    background: Vec<AgentCall>,
}

/// A sub-agent call that runs in the background: its id, tool and prompt.
#[derive(Debug, Clone)]
struct AgentCall {
    call_id: String,
    name: String,
    prompt: String,
}

impl Calls {
    pub(super) fn at(path: &[std::sync::Arc<domain::Node>]) -> Self {
        let Some(start) = path
            .iter()
            .rposition(|n| matches!(n.content, NodeContent::Message { .. }))
        else {
            return Self::default();
        };
        let mut open = Vec::new();
        for n in &path[start..] {
            match &n.content {
                NodeContent::FunctionCall { call_id, .. } => open.push((call_id.clone(), n.id)),
                NodeContent::FunctionResult(r) => open.retain(|(c, _)| *c != r.call_id),
                _ => {}
            }
        }
        Self {
            open,
            background: background_calls(&path[start].content),
        }
    }

    /// What a request adds, as it is stored. A tool result answering a call that a sub-agent's
    /// function took up closes that function; one answering a call that runs in the background
    /// reports its launch, and the function runs on (started here, before the result, when the
    /// sub-agent's first request has not come yet).
    pub(super) fn stored(mut self, rest: &[&NodeContent]) -> Vec<NodeContent> {
        let mut out = Vec::with_capacity(rest.len());
        for content in rest {
            match content {
                NodeContent::Message { .. } => {
                    self.open.clear();
                    self.background = background_calls(content);
                }
                NodeContent::ToolResult { call_id, .. } => {
                    if let Some(call) = self.background.iter().find(|c| c.call_id == *call_id) {
                        if !self.open.iter().any(|(c, _)| c == call_id) {
                            out.push(NodeContent::FunctionCall {
                                call_id: call.call_id.clone(),
                                name: call.name.clone(),
                                input: call.prompt.clone(),
                                expose: domain::Expose::Io,
                            });
                        }
                        out.push((*content).clone());
                        continue;
                    }
                    out.push(as_function_result(content, &self.open));
                    continue;
                }
                _ => {}
            }
            out.push((*content).clone());
        }
        out
    }
}

/// The calls of an assistant message that start a sub-agent in the background.
fn background_calls(message: &NodeContent) -> Vec<AgentCall> {
    let NodeContent::Message {
        role: domain::Role::Assistant,
        tool_calls,
        ..
    } = message
    else {
        return Vec::new();
    };
    tool_calls
        .iter()
        .filter_map(|c| {
            let (prompt, background) = agent_call(c)?;
            (background && !prompt.is_empty()).then(|| AgentCall {
                call_id: c.call_id.clone(),
                name: c.name.clone(),
                prompt,
            })
        })
        .collect()
}

/// A tool result that answers a call a sub-agent's function took up closes that function.
fn as_function_result(content: &NodeContent, open: &[(String, NodeId)]) -> NodeContent {
    match content {
        NodeContent::ToolResult {
            call_id,
            parts,
            is_error,
            ..
        } if open.iter().any(|(c, _)| c == call_id)
            && parts.iter().all(|p| matches!(p, Part::Text(_))) =>
        {
            NodeContent::FunctionResult(domain::FunctionResult {
                call_id: call_id.clone(),
                output: Part::text_of(parts),
                status: if *is_error {
                    domain::FunctionStatus::Error
                } else {
                    domain::FunctionStatus::Completed
                },
                chain: None,
            })
        }
        other => other.clone(),
    }
}

/// A conversation that shares nothing with the session's: when it opens with the prompt of a
/// sub-agent call of the session (pending, or already taken up by a function), it is that
/// call's function, and goes on its chain.
pub(super) async fn subagent(
    store: &Store,
    session: Scoped,
    contents: &[&NodeContent],
) -> Result<Option<Plan>, Unrecorded> {
    let Some(NodeContent::Message {
        role: domain::Role::User,
        parts,
        ..
    }) = contents.first()
    else {
        return Ok(None);
    };
    let opens_with = |prompt: &str| {
        !prompt.is_empty()
            && (Part::text_of(parts) == prompt
                || parts
                    .iter()
                    .any(|p| matches!(p, Part::Text(t) if t == prompt)))
    };
    let branches = store.list_branches(session).await.map_err(store_error)?;
    let order = with_heads(&branches);
    let mut pending: Option<(BranchName, NodeId, NodeContent)> = None;
    for branch in order {
        let path = store
            .load_path(session, &PathTarget::Branch(branch.name.clone()))
            .await
            .map_err(store_error)?;
        // A function already started for this prompt: the conversation goes on in its chain.
        for n in &path.nodes {
            if let NodeContent::FunctionCall { name, input, .. } = &n.content
                && AGENT_TOOLS.contains(&name.as_str())
                && opens_with(input)
            {
                return in_function(store, session, branch.name.clone(), n, contents)
                    .await
                    .map(Some);
            }
        }
        if pending.is_some() {
            continue;
        }
        // A pending call of the latest assistant message with this prompt.
        let Some(a) = path
            .nodes
            .iter()
            .rposition(|n| matches!(n.content, NodeContent::Message { .. }))
        else {
            continue;
        };
        let NodeContent::Message {
            role: domain::Role::Assistant,
            tool_calls,
            ..
        } = &path.nodes[a].content
        else {
            continue;
        };
        let answered = |id: &str| {
            path.nodes[a + 1..].iter().any(|n| match &n.content {
                NodeContent::ToolResult { call_id, .. }
                | NodeContent::FunctionCall { call_id, .. } => call_id == id,
                NodeContent::FunctionResult(r) => r.call_id == id,
                NodeContent::Message { .. } => false,
            })
        };
        for call in tool_calls {
            if let Some((prompt, _)) = agent_call(call)
                && opens_with(&prompt)
                && !answered(&call.call_id)
            {
                let head = path.nodes.last().map(|n| n.id).unwrap_or(path.nodes[a].id);
                let node = NodeContent::FunctionCall {
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    input: prompt,
                    expose: domain::Expose::Io,
                };
                pending = Some((branch.name.clone(), head, node));
                break;
            }
        }
    }
    let Some((branch, head, call)) = pending else {
        return Ok(None);
    };
    let started = store
        .append(AppendRequest {
            session,
            target: AppendTarget::Branch(branch.clone()),
            expected_head: Some(Some(head)),
            idempotency_key: None,
            nodes: vec![call],
            pinned: Vec::new(),
        })
        .await;
    let function = match started {
        Ok(outcome) => {
            NodeId::parse("head_id", &outcome.head_id).map_err(|_| Unrecorded("store"))?
        }
        // Another request moved the branch: match again.
        Err(store::Error::Domain(domain::Error::Aborted(_))) => return Err(Unrecorded(RETRY)),
        Err(store::Error::Domain(_)) => return Ok(None),
        Err(e) => return Err(store_error(e)),
    };
    let node = store
        .get_nodes(session, &[function])
        .await
        .map_err(store_error)?;
    let Some(node) = node.first() else {
        return Err(Unrecorded("store"));
    };
    Ok(Some(Plan {
        branch,
        function: Some((function, node.hash)),
        expected: None,
        rest: owned(contents),
        behind: false,
        agent_summary: None,
    }))
}

/// A sub-agent's request whose function exists: what its chain holds of it, and the rest.
async fn in_function(
    store: &Store,
    session: Scoped,
    branch: BranchName,
    call: &domain::Node,
    contents: &[&NodeContent],
) -> Result<Plan, Unrecorded> {
    let hashes = chain_hashes(contents, Some(&call.hash));
    let path = store
        .load_path(session, &PathTarget::Function(call.id))
        .await
        .map_err(store_error)?;
    let head = path
        .nodes
        .last()
        .filter(|n| n.function_id == Some(call.id))
        .map(|n| (n.id, n.hash));
    let stored = stored_prefix(store, session, &hashes).await?;
    let done = stored.map_or(0, |(k, _)| k + 1);
    if stored.map(|(_, n)| n) != head.map(|(id, _)| id) {
        return Err(Unrecorded("a sub-agent's history that left its chain"));
    }
    Ok(Plan {
        branch,
        function: Some((call.id, call.hash)),
        expected: head,
        rest: owned(&contents[done..]),
        behind: false,
        agent_summary: None,
    })
}
