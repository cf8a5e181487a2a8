//! One branch as a Claude Code-style session file (what `import::claude_code` reads), its lines
//! written by `provider::anthropic::session`: `user` and `assistant` lines with `text`, `image`, `tool_use` and `tool_result` blocks, chained by
//! `uuid`/`parentUuid` (the node ids). A function's chain is written as a sidechain
//! (`isSidechain`, `agentId`), linked to the call that started it by a `progress` line, as
//! Claude Code writes sub-agents; its result is the `tool_result` answering that call.
//!
//! The format has no place for other branches, summaries, pins, system or developer messages,
//! media by URL, or a function's `expose`; each one met is a warning.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use super::{Branch, Export, line, url_media};
use crate::domain::{Expose, FunctionStatus, Node, NodeContent, NodeId, Part, Role, Snapshot};
use crate::provider::anthropic::session::{self, Message};

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

/// Where a chain's writing stands: the sub-agent whose sidechain it is, the last line written,
/// and the calls of the latest assistant message not yet answered.
struct Chain {
    agent: Option<NodeId>,
    parent: Option<String>,
    open: HashSet<String>,
}

impl Writer<'_, '_> {
    /// Writes one chain; `agent` is the function whose sidechain it is.
    fn chain(&mut self, nodes: &[&Arc<Node>], agent: Option<NodeId>) {
        let mut chain = Chain {
            agent,
            parent: None,
            open: HashSet::new(),
        };
        for node in nodes {
            let uuid = node.id.to_string();
            let message = match &node.content {
                NodeContent::Message {
                    role: Role::User,
                    parts,
                    ..
                } => Message::user(self.blocks(parts)),
                NodeContent::Message {
                    role: Role::Assistant,
                    parts,
                    tool_calls,
                } => {
                    chain.open = tool_calls.iter().map(|c| c.call_id.clone()).collect();
                    Message::assistant(&uuid, self.blocks(parts), tool_calls)
                }
                // A system or developer message: Claude Code's lines are user or assistant.
                NodeContent::Message { parts, .. } => {
                    self.url_media += url_media(parts);
                    self.dropped_roles += 1;
                    continue;
                }
                NodeContent::ToolResult {
                    call_id,
                    parts,
                    is_error,
                    ..
                } => {
                    chain.open.remove(call_id);
                    Message::tool_result(call_id, self.blocks(parts), *is_error)
                }
                NodeContent::FunctionCall { .. } => {
                    self.function(node, &mut chain);
                    continue;
                }
                NodeContent::FunctionResult(r) => {
                    Message::output(&r.call_id, &r.output, r.status == FunctionStatus::Error)
                }
            };
            self.push(message, uuid, &mut chain);
        }
    }

    /// A function: the call that started it (one written for it if no call of the model did),
    /// the progress line that links its sidechain to that call, and the sidechain.
    fn function(&mut self, node: &Node, chain: &mut Chain) {
        let NodeContent::FunctionCall {
            call_id,
            name,
            input,
            expose,
        } = &node.content
        else {
            return;
        };
        self.exposes += usize::from(*expose != Expose::Io);
        if !chain.open.remove(call_id) {
            let call_uuid = format!("{}-call", node.id);
            let call = Message::agent_call(&call_uuid, call_id, name, input);
            self.push(call, call_uuid, chain);
            chain.open.clear();
        }
        let agent = node.id.to_string();
        self.lines
            .push(session::progress(&self.session, call_id, &agent));
        let sidechain = self
            .branch
            .chains
            .get(&node.id)
            .cloned()
            .unwrap_or_default();
        self.chain(&sidechain, Some(node.id));
    }

    /// Writes `message` as line `uuid`, the chain's next.
    fn push(&mut self, message: Message, uuid: String, chain: &mut Chain) {
        let parent = chain.parent.replace(uuid.clone());
        let agent = chain.agent.map(|a| a.to_string());
        let line = message.line(&self.session, &uuid, parent, agent);
        self.lines.push(line);
    }

    fn blocks(&mut self, parts: &[Part]) -> Vec<Value> {
        self.url_media += url_media(parts);
        parts.iter().filter_map(session::block).collect()
    }
}
