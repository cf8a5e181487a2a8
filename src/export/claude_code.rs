//! One branch as a Claude Code-style session file (what `import::claude_code` reads): `user`
//! and `assistant` lines with `text`, `image`, `tool_use` and `tool_result` blocks, chained by
//! `uuid`/`parentUuid` (the node ids). A function's chain is written as a sidechain
//! (`isSidechain`, `agentId`), linked to the call that started it by a `progress` line, as
//! Claude Code writes sub-agents; its result is the `tool_result` answering that call.
//!
//! The format has no place for other branches, summaries, pins, system or developer messages,
//! media by URL, or a function's `expose`; each one met is a warning.

use std::collections::HashSet;

use base64::Engine as _;
use serde_json::{Value, json};

use super::{Branch, Export, line};
use crate::domain::{
    Expose, FunctionStatus, MediaSource, Node, NodeContent, NodeId, Part, Role, Snapshot,
};
use crate::provider::format::{anthropic_block, tool_result_message, tool_use_block};

pub(super) fn export<'a>(snapshot: &'a Snapshot, branch: Branch<'a>) -> Export<'a> {
    let mut writer = Writer {
        session: snapshot.session.id.to_string(),
        branch: &branch,
        lines: Vec::new(),
        dropped_roles: 0,
        url_media: 0,
        exposes: 0,
    };
    writer.chain(&branch.path, None);
    let mut warnings = branch.left_out(snapshot);
    if writer.dropped_roles > 0 {
        warnings.push(format!(
            "{} system or developer messages are left out (Claude Code lines are user or assistant)",
            writer.dropped_roles
        ));
    }
    if writer.url_media > 0 {
        warnings.push(format!(
            "{} media parts by URL are left out (an image block holds bytes)",
            writer.url_media
        ));
    }
    if writer.exposes > 0 {
        warnings.push(format!(
            "{} functions exposed other than as call and result (`expose`) import as `io`",
            writer.exposes
        ));
    }
    let lines = writer.lines;
    Export {
        warnings,
        pieces: Box::new(lines.into_iter().map(|v| line(&v))),
    }
}

struct Writer<'b, 'a> {
    session: String,
    branch: &'b Branch<'a>,
    lines: Vec<Value>,
    dropped_roles: usize,
    url_media: usize,
    exposes: usize,
}

impl Writer<'_, '_> {
    /// Writes one chain; `agent` is the function whose sidechain it is.
    fn chain(&mut self, nodes: &[&std::sync::Arc<Node>], agent: Option<NodeId>) {
        let mut parent: Option<String> = None;
        let mut open: HashSet<String> = HashSet::new();
        for node in nodes {
            let uuid = node.id.to_string();
            let entry = match &node.content {
                NodeContent::Message {
                    role,
                    parts,
                    tool_calls,
                } => {
                    let mut content = self.blocks(parts);
                    match role {
                        Role::System | Role::Developer => {
                            self.dropped_roles += 1;
                            continue;
                        }
                        Role::User => Some(("user", json!({ "role": "user", "content": content }))),
                        Role::Assistant => {
                            for c in tool_calls {
                                content.push(tool_use_block(
                                    &c.call_id,
                                    &c.name,
                                    &c.arguments_json,
                                ));
                            }
                            open = tool_calls.iter().map(|c| c.call_id.clone()).collect();
                            Some((
                                "assistant",
                                json!({ "id": format!("msg_{uuid}"), "role": "assistant", "content": content }),
                            ))
                        }
                    }
                }
                NodeContent::ToolResult {
                    call_id,
                    parts,
                    is_error,
                    ..
                } => {
                    open.remove(call_id);
                    let content = self.blocks(parts);
                    Some((
                        "user",
                        tool_result_message(call_id, Value::Array(content), *is_error),
                    ))
                }
                NodeContent::FunctionCall {
                    call_id,
                    name,
                    input,
                    expose,
                } => {
                    self.exposes += usize::from(*expose != Expose::Io);
                    // A function started by no call of the model gets one, so its result pairs.
                    if !open.remove(call_id) {
                        let call_uuid = format!("{uuid}-call");
                        self.push(
                            "assistant",
                            &call_uuid,
                            parent.replace(call_uuid.clone()),
                            agent,
                            json!({
                                "id": format!("msg_{call_uuid}"), "role": "assistant",
                                "content": [tool_use_block(
                                    call_id,
                                    name,
                                    &json!({ "prompt": input }).to_string(),
                                )],
                            }),
                        );
                        open.clear();
                    }
                    self.lines.push(json!({
                        "type": "progress",
                        "parentToolUseID": call_id,
                        "data": { "type": "agent_progress", "agentId": node.id.to_string() },
                        "sessionId": self.session,
                    }));
                    let chain = self
                        .branch
                        .chains
                        .get(&node.id)
                        .cloned()
                        .unwrap_or_default();
                    self.chain(&chain, Some(node.id));
                    None
                }
                NodeContent::FunctionResult(r) => Some((
                    "user",
                    tool_result_message(
                        &r.call_id,
                        json!([{ "type": "text", "text": r.output }]),
                        r.status == FunctionStatus::Error,
                    ),
                )),
            };
            if let Some((kind, message)) = entry {
                self.push(kind, &uuid, parent.replace(uuid.clone()), agent, message);
            }
        }
    }

    fn push(
        &mut self,
        kind: &str,
        uuid: &str,
        parent: Option<String>,
        agent: Option<NodeId>,
        message: Value,
    ) {
        let mut v = json!({
            "type": kind,
            "uuid": uuid,
            "parentUuid": parent,
            "sessionId": self.session,
            "isSidechain": agent.is_some(),
            "message": message,
        });
        if let Some(agent) = agent {
            v["agentId"] = Value::String(agent.to_string());
        }
        self.lines.push(v);
    }

    fn blocks(&mut self, parts: &[Part]) -> Vec<Value> {
        parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(text) => Some(json!({ "type": "text", "text": text })),
                Part::Media {
                    mime_type,
                    source: MediaSource::Data(data),
                } => Some(json!({
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": mime_type,
                        "data": base64::engine::general_purpose::STANDARD.encode(data),
                    },
                })),
                Part::Media {
                    source: MediaSource::Url(_),
                    ..
                } => {
                    self.url_media += 1;
                    None
                }
                // A kept Messages API block is written as itself; other APIs' are not
                // Claude Code's to carry.
                Part::Block(_) => anthropic_block(p),
            })
            .collect()
    }
}
