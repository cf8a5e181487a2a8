//! Where an answer goes once whole: the request's recording it waits for, the answer appended
//! after the request's history, and the call's usage recorded.

use axum::http::{HeaderMap, HeaderValue};

use super::{Api, ledger};
use crate::domain::{self, AskedEdit, GatewayCall, NodeContent, NodeId, ProviderUsage};
use crate::store::{Scoped, now_ms};
use crate::workflow::Workflows;
use crate::workflow::record::Recorded;

/// Where an answer goes once whole.
pub(super) struct Sink {
    pub(super) workflows: Workflows,
    pub(super) api: Api,
    pub(super) stream: bool,
    pub(super) model: String,
    pub(super) client_tokens: u64,
    pub(super) forwarded_tokens: u64,
    /// Where the request goes, as the answer's headers name it.
    pub(super) named: Named,
    pub(super) recording: Recording,
    pub(super) verdict: Option<ledger::Verdict>,
    /// The model table's entry that priced the call, the edit asked of the provider, and the
    /// thinking blocks left out.
    pub(super) priced_by: String,
    pub(super) asked: Option<AskedEdit>,
    pub(super) thinking_dropped: u32,
    /// Opened once the upstream has answered: a request located without writing is recorded
    /// then (dropped unopened, it records nothing).
    pub(super) gate: Option<tokio::sync::oneshot::Sender<()>>,
    /// The conversation's ledger state, being saved beside the upstream call: the client sees
    /// the end of the answer once it is saved.
    pub(super) saving: Option<tokio::task::JoinHandle<()>>,
}

/// The session, branch and function a request goes to.
pub(super) struct Named {
    pub(super) session: Scoped,
    pub(super) branch: domain::BranchName,
    pub(super) function: Option<NodeId>,
}

/// A request recorded, or being recorded beside its upstream call.
pub(super) enum Recording {
    Done(Box<Recorded>),
    Pending(tokio::task::JoinHandle<Option<Recorded>>),
    /// Its recording failed or never began.
    Lost,
}

impl Recording {
    pub(super) async fn get(&mut self) -> Option<&Recorded> {
        if let Recording::Pending(task) = self {
            *self = match task.await {
                Ok(Some(recorded)) => Recording::Done(Box::new(recorded)),
                _ => Recording::Lost,
            };
        }
        match self {
            Recording::Done(recorded) => Some(recorded),
            Recording::Pending(_) | Recording::Lost => None,
        }
    }
}

impl Sink {
    /// Names the session, branch and function the request goes to.
    pub(super) fn name(&self, h: &mut HeaderMap) {
        let id = self.named.session.id().to_string();
        if let Ok(v) = HeaderValue::from_str(&id) {
            h.insert("x-ctxd-session-id", v);
        }
        if let Ok(v) = HeaderValue::from_str(self.named.branch.as_str()) {
            h.insert("x-ctxd-branch", v);
        }
        if let Some(function) = self.named.function
            && let Ok(v) = HeaderValue::from_str(&function.to_string())
        {
            h.insert("x-ctxd-function-id", v);
        }
    }

    /// Waits for the conversation's ledger state to be saved (at once when it is, or was never
    /// to be).
    pub(super) async fn saved(&mut self) {
        if let Some(saving) = self.saving.take() {
            let _ = saving.await;
        }
    }

    /// Appends the answer after the request, once the request is recorded.
    pub(super) async fn append(&mut self, content: NodeContent) {
        let Some(recorded) = self.recording.get().await else {
            tracing::info!("gateway: the request was not recorded, so neither is its answer");
            return;
        };
        self.workflows.append_answer(recorded, content).await;
    }

    pub(super) async fn usage(mut self, usage: ProviderUsage) {
        // A call whose request was never recorded leaves no record of its usage either.
        if self.recording.get().await.is_none() {
            return;
        }
        let call = GatewayCall {
            at_ms: now_ms(),
            api: self.api.name().to_owned(),
            model: self.model,
            client_tokens: self.client_tokens,
            forwarded_tokens: self.forwarded_tokens,
            usage,
            kept_tokens: self.verdict.map_or(0, |v| {
                let prompt = usage.input + usage.cache_read + usage.cache_write;
                (prompt as f64 * v.kept_share).round() as u64
            }),
            change: self.verdict.and_then(|v| v.change),
            priced_by: self.priced_by,
            asked: self.asked,
            thinking_dropped: self.thinking_dropped,
        };
        self.workflows.record_call(self.named.session, &call).await;
    }
}
