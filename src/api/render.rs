//! The reading RPCs: `Render`, `ContextStats`, `Recall`, `RecallTool`, and the inspector's
//! savings replay.

use tonic::{Request, Status};

use super::parse::{
    self, RenderArgs, provider_format, render_request, render_request_for, session_id,
};
use super::{convert, domain_status, pb, status, workflow_status};
use crate::domain::{PathView, Tenant, WireFormat};
use crate::provider::anthropic::edits;
use crate::provider::codec::recall_tool;
use crate::recall;
use crate::render::Rendered;
use crate::workflow::SavingsReport;
use crate::workflow::render::{ForModel, Reasoned};

use super::service::{ContextStoreService, Reply, split, tenant_of};

impl ContextStoreService {
    pub(super) async fn render_branch(
        &self,
        request: Request<pb::RenderRequest>,
    ) -> Reply<pb::RenderResponse> {
        let (tenant, r) = split(request);
        let format = provider_format(r.format)?;
        let strict = r.strict_format;
        let (path, rendered, reasoned) = self.rendered(&tenant, r.into()).await?;
        let (head_id, head_hash) = path
            .nodes
            .last()
            .map(|n| (n.id.to_string(), n.hash.to_hex()))
            .unwrap_or_default();
        let report = convert::reasoned_report(&rendered.report, &reasoned);
        // A step said as the provider's edit: the messages go unreduced, with the edit.
        let (messages_json, betas) = match (format, &reasoned.edit) {
            (Some(f @ crate::provider::format::Format::AnthropicMessages), Some((edit, whole))) => {
                let document = crate::provider::format::document(f, whole);
                (
                    edits::with_edit(&document, edit).unwrap_or(document),
                    vec![edits::CONTEXT_MANAGEMENT_BETA.to_owned()],
                )
            }
            _ => (
                format
                    .map(|f| crate::provider::format::document(f, &rendered.messages))
                    .unwrap_or_default(),
                Vec::new(),
            ),
        };
        let uncarried = format
            .map(|f| crate::provider::format::uncarried(f, &rendered.messages))
            .unwrap_or_default();
        if let (true, Some(format), Some(first)) = (strict, format, uncarried.first()) {
            let node = first
                .node_id
                .map_or_else(|| "a summary".to_owned(), |id| format!("node {id}"));
            return Err(domain_status(crate::domain::Error::invalid(
                "strict_format",
                format!(
                    "{node} part {} ({}) cannot be carried by {}{}",
                    first.part_index,
                    first.mime_type,
                    format.name(),
                    match uncarried.len() {
                        1 => String::new(),
                        n => format!(", nor {} more part(s)", n - 1),
                    }
                ),
            )));
        }
        self.reply(pb::RenderResponse {
            messages: rendered
                .messages
                .into_iter()
                .zip(rendered.tokens)
                .map(|(m, t)| convert::rendered(m, t))
                .collect(),
            head_id,
            head_hash,
            total_tokens: report.total_tokens,
            tokenizer: report.tokenizer.clone(),
            report: Some(report),
            messages_json,
            uncarried: uncarried
                .into_iter()
                .map(|u| pb::UncarriedPart {
                    node_id: u.node_id.map(|id| id.to_string()).unwrap_or_default(),
                    part_index: u32::try_from(u.part_index).unwrap_or(u32::MAX),
                    mime_type: u.mime_type,
                })
                .collect(),
            betas,
        })
    }

    pub(super) async fn stats(
        &self,
        request: Request<pb::ContextStatsRequest>,
    ) -> Reply<pb::ContextReport> {
        let tenant = tenant_of(&request);
        let (_, rendered, reasoned) = self.rendered(&tenant, request.into_inner().into()).await?;
        self.reply(convert::reasoned_report(&rendered.report, &reasoned))
    }

    pub(super) async fn recall_nodes(
        &self,
        request: Request<pb::RecallRequest>,
    ) -> Reply<pb::RecallResponse> {
        let (tenant, request) = split(request);
        let session = session_id(&request.session_id)?;
        let prefix = parse::reference(&request.reference)?;
        let max_chars = parse::recall_max_chars(request.max_chars)?;
        let session = self.scope(&tenant, session).await?;
        let node = self
            .store
            .node_by_reference(session, &prefix)
            .await
            .map_err(status)?;
        let recalled = recall::recalled(&node, max_chars);
        self.reply(pb::RecallResponse {
            node_id: node.id.to_string(),
            kind: recalled.kind.to_owned(),
            content: recalled.content,
            total_chars: u64::try_from(recalled.total_chars).unwrap_or(u64::MAX),
            truncated: recalled.truncated,
            tool_call_id: recalled.tool_call_id,
            tool_name: recalled.tool_name,
        })
    }

    pub(super) async fn recall_tool_specs(
        &self,
        _request: Request<pb::RecallToolRequest>,
    ) -> Reply<pb::RecallToolResponse> {
        self.reply(pb::RecallToolResponse {
            name: recall::TOOL_NAME.to_owned(),
            anthropic_json: recall_tool(WireFormat::AnthropicMessages).to_string(),
            openai_json: recall_tool(WireFormat::ChatCompletions).to_string(),
            responses_json: recall_tool(WireFormat::Responses).to_string(),
        })
    }

    /// Parses, loads and renders; the one path behind `Render` and `ContextStats`, so the two
    /// always agree.
    async fn rendered(
        &self,
        tenant: &Tenant,
        args: RenderArgs,
    ) -> Result<(PathView, Rendered, Reasoned), Status> {
        let (session, target, tokenizer, options, choice) = render_request_for(args)?;
        let session = self.scope(tenant, session).await?;
        let model = choice.map(|c| ForModel {
            entry: self.workflows.models.entry(&c.name),
            reasoning: c.reasoning,
            prices: c.prices,
            idle_ms: c.idle_ms,
        });
        self.workflows
            .render_for(session, &target, tokenizer, options, model)
            .await
            .map_err(workflow_status)
    }

    /// What a render request's policy saved over the session's newest `calls` model calls,
    /// replayed (the inspector's savings view).
    pub async fn savings(
        &self,
        request: Request<pb::RenderRequest>,
        calls: usize,
    ) -> Result<SavingsReport, Status> {
        let tenant = tenant_of(&request);
        let (session, target, tokenizer, options) = render_request(request.into_inner().into())?;
        let session = self.scope(&tenant, session).await?;
        self.workflows
            .savings(session, &target, tokenizer, options, calls)
            .await
            .map_err(workflow_status)
    }
}
