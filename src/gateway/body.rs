//! The body forwarded upstream: the client's body with its conversation replaced by the render
//! of the branch it extends, or the client's bytes as sent where the render changed nothing.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::value::RawValue;

use super::config::render_options;
use super::{Api, App, forward, json, ledger};
use crate::domain::{AskedEdit, NodeContent, Part, PathView};
use crate::provider::anthropic::{self, edits};
use crate::provider::conversation::{Conversation, estimate};
use crate::render::{self, Message};
use crate::store::PathTarget;
use crate::tokens::Tokenizer;
use crate::workflow::record::{self, Recorded, extended};
use crate::workflow::render::{Reasoning, cleared_calls};

impl App {
    /// The body to forward: the client's, with `messages` replaced by the branch's render.
    pub(super) async fn rendered_body(
        &self,
        api: Api,
        conv: &Conversation,
        recorded: &Recorded,
        body: &[u8],
    ) -> Result<ForwardedBody, &'static str> {
        let (mut options, mode) = self.options(api, conv, recorded.seen)?;
        let target = match recorded.function {
            // A sub-agent sees its own conversation, as its client sent it. It is short by
            // design: a step must pay back with better odds than in its parent.
            Some((id, _)) => {
                options.callers = render::Callers::None;
                options.policy.payback_odds = SUB_AGENT_PAYBACK_ODDS;
                PathTarget::Function(id)
            }
            None => match (recorded.behind, recorded.head) {
                (true, Some((head, _))) => PathTarget::Node(head),
                _ => PathTarget::Branch(recorded.branch.clone()),
            },
        };
        let path = self
            .workflows
            .call_path(recorded.session, &target)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "gateway: a path was not loaded");
                "render"
            })?;
        let key = (recorded.session, recorded.function.map(|(id, _)| id));
        self.forwarded_body(api, conv, path, options, body, key, mode)
            .await
    }

    /// The render options of a request whose model has read `seen`, and how its steps reach
    /// the provider; the agent's own summary request reads everything it sent, so nothing of
    /// it is reduced.
    fn options(
        &self,
        api: Api,
        conv: &Conversation,
        seen: render::Seen,
    ) -> Result<(render::Options, Mode), &'static str> {
        let (entry, window) = self.model(conv);
        let mut options = render_options(conv, &window, &entry)
            .ok_or("a budget that leaves the history nothing")?;
        options.seen = if crate::provider::agents::is_summary_request(conv) {
            render::Seen::Nothing
        } else {
            seen
        };
        let mode = match (
            api.provider_edits(),
            entry.binds(conv.reasoning),
            self.reasoning,
        ) {
            (true, true, Reasoning::Keep) => Mode::Edits,
            (true, true, Reasoning::Drop) => Mode::DropThinking,
            _ => Mode::Rewrite,
        };
        if mode == Mode::Edits {
            options.policy.provider_edits = true;
            options.policy.microcompact_keep = EDITS_KEEP;
        }
        Ok((options, mode))
    }

    /// The body to forward for a request located but not yet recorded: the stored path it
    /// reaches with what it adds after it, in memory, rendered. What the request adds is moved
    /// from the conversation into that path and back into `located` once the body is written,
    /// so a large request is held once, not once per copy (see [`record::Located::lent`]).
    pub(super) async fn located_body(
        &self,
        api: Api,
        conv: &mut Conversation,
        located: &mut record::Located,
        body: &[u8],
    ) -> Result<ForwardedBody, &'static str> {
        let t0 = std::time::Instant::now();
        let (options, mode) = self.options(api, conv, located.seen())?;
        let stored = match located.expected {
            Some((node, _)) => self
                .workflows
                .call_path(located.session, &PathTarget::Node(node))
                .await
                .map_err(|e| {
                    tracing::warn!(error = %e, "gateway: a path was not loaded");
                    "render"
                })?,
            None => PathView::default(),
        };
        let mut state = ledger::State::load(&self.workflows, (located.session, None)).await;
        if located.behind {
            let (path, rendered) = self.rendered(stored, options, &mut state).await?;
            let contents: Vec<&NodeContent> = conv.items.iter().map(|i| &i.content).collect();
            return written(api, conv, &contents, &path, rendered, body, state, mode);
        }
        let t_load = t0.elapsed();
        located.lend(conv);
        let added = located.rest.len();
        let path = extended(stored, std::mem::take(&mut located.rest));
        let (path, rendered) = match self.rendered(path, options, &mut state).await {
            Ok(r) => r,
            Err(reason) => {
                // What was lent went with the path: the request cannot be recorded.
                located.lost = true;
                return Err(reason);
            }
        };
        let forwarded = {
            let lent = located.lent;
            let held = conv.items.len() - lent;
            let contents: Vec<&NodeContent> = conv.items[..held]
                .iter()
                .map(|i| &i.content)
                .chain(
                    path.nodes[path.nodes.len() - lent..]
                        .iter()
                        .map(|n| &n.content),
                )
                .collect();
            let t_render = t0.elapsed();
            let forwarded = written(api, conv, &contents, &path, rendered, body, state, mode);
            tracing::debug!(
                load_us = t_load.as_micros() as u64,
                render_us = (t_render - t_load).as_micros() as u64,
                write_us = (t0.elapsed() - t_render).as_micros() as u64,
                "gateway: a located request's time to load, render and write"
            );
            forwarded
        };
        let at = path.nodes.len() - added;
        let mut nodes = path.nodes;
        located.rest = nodes
            .drain(at..)
            .map(|n| Arc::try_unwrap(n).map_or_else(|n| n.content.clone(), |n| n.content))
            .collect();
        forwarded
    }

    /// The render of `path` for the next call of the conversation whose ledger state is `state`.
    /// A step reduces only what the model had read when the step was taken: between steps
    /// the conversation renders with what was seen at its last step (`ledger::State::horizon`),
    /// so a result that arrived with the step is not cut the call after it, which would write the
    /// prefix the step just wrote again; a call that takes a new step renders with what the
    /// model has seen now, and that becomes the horizon.
    async fn rendered(
        &self,
        path: PathView,
        options: render::Options,
        state: &mut ledger::State,
    ) -> Result<(PathView, render::Rendered), &'static str> {
        let render = |path: PathView, options: render::Options| async move {
            self.workflows
                .render_path(path, Tokenizer::Heuristic, options)
                .await
                .map_err(|e| {
                    tracing::warn!(error = %e, "gateway: render failed");
                    "render"
                })
        };
        // The provider's cache expires by time since this conversation's last call, which the
        // gateway knows better than the path does.
        let options = render::Options {
            last_call_ms: state.last_call(),
            ..options
        };
        let horizon = state.horizon();
        let held = match (horizon, options.seen) {
            (Some((_, seen)), render::Seen::Through(_))
                if path.nodes.iter().any(|n| n.id == seen) =>
            {
                Some(render::Options {
                    seen: render::Seen::Through(seen),
                    ..options
                })
            }
            _ => None,
        };
        let (path, rendered) = match held {
            Some(held) => {
                let (path, rendered) = render(path, held).await?;
                if horizon.is_some_and(|(b, _)| b == rendered.report.microcompact_boundary) {
                    (path, rendered)
                } else {
                    render(path, options).await?
                }
            }
            None => render(path, options).await?,
        };
        let boundary = rendered.report.microcompact_boundary;
        if boundary > 0
            && horizon.is_none_or(|(b, _)| b != boundary)
            && let render::Seen::Through(seen) = options.seen
        {
            state.set_horizon((boundary, seen));
        }
        Ok((path, rendered))
    }

    /// `body` with its conversation replaced by the render of `path`.
    #[allow(clippy::too_many_arguments)]
    async fn forwarded_body(
        &self,
        api: Api,
        conv: &Conversation,
        path: PathView,
        options: render::Options,
        body: &[u8],
        key: ledger::Key,
        mode: Mode,
    ) -> Result<ForwardedBody, &'static str> {
        let mut state = ledger::State::load(&self.workflows, key).await;
        let (path, rendered) = self.rendered(path, options, &mut state).await?;
        let contents: Vec<&NodeContent> = conv.items.iter().map(|i| &i.content).collect();
        written(api, conv, &contents, &path, rendered, body, state, mode)
    }
}

/// The body to forward: `body` with its conversation the render of `path` (`contents` are the
/// request's items' contents; `ledger` the conversation's ledger state). The render is let go
/// before the body is written, so a large request's text is not held three times over while
/// it is.
#[allow(clippy::too_many_arguments)]
fn written(
    api: Api,
    conv: &Conversation,
    contents: &[&NodeContent],
    path: &PathView,
    mut rendered: render::Rendered,
    body: &[u8],
    ledger: ledger::State,
    mode: Mode,
) -> Result<ForwardedBody, &'static str> {
    let members = json::Members::of(body).ok_or("a body that is not an object")?;
    let client = forward::client_entries(&members, api.field());
    let tokens = forwarded_tokens(&rendered.messages);
    let step = ledger::Step {
        trigger: rendered.report.trigger,
        boundary: rendered.report.microcompact_boundary,
        // One that pays at once pays within a call.
        payback_calls: rendered.report.payback_calls.map(|n| n.max(1)),
    };
    if mode == Mode::Edits {
        let client = client.ok_or("a body whose messages are not an array")?;
        return Ok(edited(
            conv, &client, &members, &rendered, tokens, step, ledger,
        ));
    }
    // The common case, a render that changed nothing: the client's body goes as sent, found
    // without building the forwarded conversation (debug builds check it against that build).
    // Dropping thinking: every entry is checked, so the conversation is built in full.
    let as_sent = match mode {
        Mode::DropThinking => None,
        _ => forward::as_sent(conv, contents, client.as_deref(), path, &rendered.messages),
    };
    let mut ledger = ledger;
    let mut thinking_dropped = 0;
    // The forwarded conversation in full: the entries and what they keep.
    let build = |messages: &mut [Message]| {
        forward::conversation(api, conv, contents, client.as_deref(), path, messages)
    };
    #[cfg(debug_assertions)]
    if let Some(kept) = &as_sent {
        let (entries, built) = build(&mut rendered.messages);
        assert_eq!(&built, kept, "as_sent keeps what the full build keeps");
        assert!(
            forward::all_client_entries(&entries, client.as_deref()),
            "as_sent forwards what the full build forwards"
        );
    }
    let (body, kept) = match as_sent {
        Some(kept) => (None, kept),
        None => {
            let (mut entries, mut kept) = build(&mut rendered.messages);
            drop(rendered);
            if mode == Mode::DropThinking {
                let (dropped, sent) =
                    forward::thinking::drop_invalidated(&mut entries, &mut kept, ledger.sent());
                thinking_dropped = dropped;
                ledger.set_sent(sent);
            }
            if kept.forwarded_markers < kept.client_markers.min(MAX_MESSAGE_MARKERS) {
                tracing::debug!(
                    ?kept,
                    "gateway: fewer breakpoints forwarded than the client sent"
                );
            }
            let body = if forward::all_client_entries(&entries, client.as_deref()) {
                None
            } else {
                Some(
                    members
                        .with_entries(api.field(), &entries)
                        .ok_or("a body that is not an object")?,
                )
            };
            (body, kept)
        }
    };
    Ok(ForwardedBody {
        body,
        tokens,
        kept,
        step,
        ledger,
        asked: None,
        beta: None,
        thinking_dropped,
    })
}

/// The body to forward for a model that binds its thinking: the client's, as sent, with the
/// render's step said as the provider's edit (merged into the client's own
/// `context_management`), so no thinking block's prefix changes; the client's own clearing,
/// when it asks for one, stands instead.
fn edited(
    conv: &Conversation,
    client: &[&RawValue],
    members: &json::Members<'_>,
    rendered: &render::Rendered,
    tokens: u64,
    step: ledger::Step,
    ledger: ledger::State,
) -> ForwardedBody {
    let cleared = cleared_calls(&rendered.messages);
    let uses: Vec<&str> = conv
        .items
        .iter()
        .filter_map(|i| match &i.content {
            NodeContent::Message { tool_calls, .. } => Some(tool_calls),
            _ => None,
        })
        .flatten()
        .map(|c| c.call_id.as_str())
        .collect();
    let client_cm = members.get(edits::CONTEXT_MANAGEMENT);
    let edit = edits::clearing(uses.iter().copied(), &cleared)
        .filter(|_| !edits::client_clears(client_cm));
    let body = edit.as_ref().and_then(|edit| {
        let merged = edits::merged(client_cm, edit).ok()?;
        members.with_member(edits::CONTEXT_MANAGEMENT, &merged)
    });
    // What the provider clears: the oldest `clear` tool uses, whatever the render cleared
    // after a result it kept.
    let asked = edit.filter(|_| body.is_some());
    let clears: HashSet<&str> = uses
        .iter()
        .take(asked.as_ref().map_or(0, |e| e.clear as usize))
        .copied()
        .collect();
    ForwardedBody {
        kept: forward::edited::kept(conv, client, &clears),
        body,
        tokens,
        step,
        ledger,
        beta: asked.map(|_| edits::CONTEXT_MANAGEMENT_BETA),
        asked,
        thinking_dropped: 0,
    }
}

/// How a request's steps reach the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// ctxd's render in place of the client's messages.
    Rewrite,
    /// The client's messages as sent, each step the provider's own edit: a model that binds
    /// its thinking to its prefix (`--gateway-reasoning keep`).
    Edits,
    /// ctxd's render, the thinking blocks it invalidated left out (`--gateway-reasoning drop`).
    DropThinking,
}

/// The results a step said as the provider's edit keeps: the newest only. Under preserved
/// thinking the model's own reasoning over every result it read stays in its context, so a
/// result it has read and reasoned on is what an edit may clear; and since the client's
/// breakpoints stand at the end of the conversation, every such step writes the whole
/// conversation again, which pays back soonest when it clears the most, as the cheaper reads
/// of the models that bind (0.05x, 0.025x) need. With the real Claude Code on the scripted
/// `reports` session (`gateway_claude_code.rs`), keeping 1 costs 0.753x of straight at 0.1x
/// reads and 0.854x at Opus 5.5's 0.05x (the `logs` session: 0.767x and 0.876x); keeping 2,
/// 0.820x and 0.919x; keeping 3 (the gateway's keep elsewhere), 0.841x and 0.911x.
const EDITS_KEEP: usize = 1;

/// The odds a step of a sub-agent's conversation must pay back with (the render's default):
/// the shared traces' Claude Code sub-agents run 3 to 18 calls.
const SUB_AGENT_PAYBACK_ODDS: usize = render::PAYBACK_ODDS;

/// A forwarded body and what the ledger needs of it.
pub(super) struct ForwardedBody {
    /// `None`: the client's body, as sent.
    pub(super) body: Option<Vec<u8>>,
    pub(super) tokens: u64,
    pub(super) kept: forward::Kept,
    pub(super) step: ledger::Step,
    /// The conversation's ledger state, the render's step taken into it.
    pub(super) ledger: ledger::State,
    /// The edit asked of the provider in place of a step, and the `anthropic-beta` it needs.
    pub(super) asked: Option<AskedEdit>,
    pub(super) beta: Option<&'static str>,
    /// Thinking blocks left out as a step invalidated them.
    pub(super) thinking_dropped: u32,
}

/// Breakpoints a client can place on messages at most (the API's four).
const MAX_MESSAGE_MARKERS: usize = anthropic::MAX_MARKERS;

/// Tokens of the forwarded messages, counted as the client's are.
fn forwarded_tokens(messages: &[Message]) -> u64 {
    messages
        .iter()
        .map(|m| {
            let parts: usize = m.parts.iter().map(Part::byte_len).sum();
            let calls: usize = m
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments_json.len())
                .sum();
            estimate(parts + calls) + 4
        })
        .sum()
}
