//! One call through the gateway: read, record (or locate, to record beside the upstream call),
//! render and forward; the ledger's verdict on what was forwarded, and an agent's own summary
//! laid over the history it replaced.

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use serde_json::Value;

use super::answer::{Named, Recording, Sink};
use super::body::ForwardedBody;
use super::config::GatewayPolicy;
use super::{
    Api, App, count, invalid, ledger, passthrough, request_policy, resend, session_header,
    text_headers,
};
use crate::domain::AskedEdit;
use crate::provider::codec::Request;
use crate::provider::conversation::{Conversation, Refusal};
use crate::store::now_ms;
use crate::workflow::record::{self, Call, Unrecorded};

/// A model call's request, read once for whatever its path asks: who calls, how it is
/// forwarded, what it says, and when its reading began.
pub(super) struct Parsed {
    pub(super) call: Call,
    pub(super) policy: GatewayPolicy,
    pub(super) conv: Conversation,
    pub(super) started: std::time::Instant,
    /// The request as its conversation's next one is compared with, when it is remembered.
    pub(super) remembered: Option<std::sync::Arc<resend::Previous>>,
}

impl App {
    /// Reads a model call's request: its caller's tenant, the body through the API's codec
    /// (the parsed JSON lives only while it is read: a large body is not held twice more), and
    /// ctxd's own headers. Else the answer: a provider-shaped 4xx naming the field (counted),
    /// or, for a request ctxd cannot record, the upstream's answer to it as sent.
    #[allow(clippy::result_large_err)]
    pub(super) async fn parsed(
        &self,
        api: Api,
        uri: &Uri,
        headers: &HeaderMap,
        body: &Bytes,
    ) -> Result<Parsed, Response> {
        let started = std::time::Instant::now();
        let tenant = self.tenant(api, headers)?;
        let refused = |field: &str, message: &str| {
            count(api, "invalid");
            Err(invalid(api, field, message))
        };
        let text = text_headers(headers);
        let named = session_header(headers);
        // A conversation's request usually resends its previous one: read from what changed,
        // where the format can be.
        let key = named
            .as_ref()
            .ok()
            .filter(|_| api.read_resent().is_some())
            .map(|named| resend::Key::new(&tenant, api, uri.path(), named.as_deref()));
        let compared = resend::compared_headers(&text);
        let previous = key.as_ref().and_then(|k| self.resends.get(k, body));
        let resent = previous
            .as_deref()
            .and_then(|p| resend::resent(api, p, body, compared.clone()));
        tracing::debug!(
            remembered = previous.is_some(),
            resent = resent.is_some(),
            "gateway: a request read from what changed, or whole"
        );
        let mut remembered = None;
        let mut known = None;
        let read = match resent {
            Some((conv, next, what)) => {
                #[cfg(debug_assertions)]
                {
                    let whole = serde_json::from_slice::<Value>(body).map(|body| {
                        api.read(Request {
                            path: uri.path(),
                            body,
                            headers: &text,
                        })
                    });
                    assert_eq!(
                        whole.ok(),
                        Some(Ok(conv.clone())),
                        "a resent request reads as it does whole"
                    );
                }
                if let Some(key) = key {
                    remembered = Some(self.resends.remember(key, next, previous.as_ref()));
                }
                known = what;
                metrics::counter!("ctxd_gateway_reads_total", "read" => "resent").increment(1);
                Ok(conv)
            }
            None => match serde_json::from_slice::<Value>(body) {
                Ok(value) => {
                    metrics::counter!("ctxd_gateway_reads_total", "read" => "whole").increment(1);
                    let read = api.read(Request {
                        path: uri.path(),
                        body: value,
                        headers: &text,
                    });
                    if let (Ok(conv), Some(key)) = (&read, key)
                        && let Some(p) = resend::Previous::of(api, body.clone(), compared, conv)
                    {
                        remembered = Some(self.resends.remember(key, p, None));
                    }
                    read
                }
                Err(e) => return refused("body", &format!("not JSON: {e}")),
            },
        };
        let Ok(policy) = request_policy(self.policy, headers) else {
            return refused("x-ctxd-policy", "must be \"stepped\" or \"passthrough\"");
        };
        let Ok(named) = named else {
            return refused("x-ctxd-session", "must be visible ASCII and not empty");
        };
        match read {
            Ok(conv) => {
                let call = Call {
                    tenant,
                    named,
                    max_part_bytes: self.max_part_bytes,
                    known,
                };
                Ok(Parsed {
                    call,
                    policy,
                    conv,
                    started,
                    remembered,
                })
            }
            Err(Refusal::Invalid { field, message }) => refused(&field, &message),
            Err(Refusal::Unrecordable(reason)) => Err(self
                .unchanged(api, reason, uri, headers, body.clone())
                .await),
        }
    }

    /// A request the gateway does not record, for `reason`: counted, and forwarded as sent.
    async fn unchanged(
        &self,
        api: Api,
        reason: &'static str,
        uri: &Uri,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Response {
        passthrough(reason);
        count(api, "passthrough");
        self.forward(api, Method::POST, uri, headers, body, None)
            .await
    }

    pub(super) async fn handle(
        &self,
        api: Api,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
        parsed: Parsed,
    ) -> Response {
        let Parsed {
            call,
            policy,
            conv,
            started: t0,
            remembered,
        } = parsed;
        let t_read = t0.elapsed();
        if policy == GatewayPolicy::Stepped {
            let located = self.workflows.locate(&call, &conv).await;
            tracing::debug!(
                read_us = t_read.as_micros() as u64,
                locate_us = (t0.elapsed() - t_read).as_micros() as u64,
                "gateway: a request's time to read and locate"
            );
            match located {
                Ok(Some(located)) => {
                    // The next request of the conversation hashes only what it adds.
                    if let Some(previous) = &remembered {
                        previous.located(located.known.hashes.clone());
                    }
                    return self
                        .handle_located(api, uri, headers, body, call, conv, located)
                        .await;
                }
                Ok(None) => {}
                Err(Unrecorded(reason)) => {
                    return self.unchanged(api, reason, &uri, &headers, body).await;
                }
            }
        }
        let recorded = match self.workflows.record(&call, &conv).await {
            Ok(r) => r,
            Err(Unrecorded(reason)) => {
                return self.unchanged(api, reason, &uri, &headers, body).await;
            }
        };
        if let Some(summary) = &recorded.agent_summary {
            self.workflows
                .lay_agent_summary(
                    &recorded,
                    summary,
                    super::config::policy().max_tool_result_chars,
                )
                .await;
        }
        let t_record = t0.elapsed();
        let out = match policy {
            GatewayPolicy::Passthrough => Outgoing::as_sent(body, &conv),
            GatewayPolicy::Stepped => {
                let rendered = self.rendered_body(api, &conv, &recorded, &body).await;
                let key = (recorded.session, recorded.function.map(|(id, _)| id));
                self.outgoing(api, &conv, key, rendered, body, Saved::Beside)
                    .await
            }
        };
        let mut headers = headers;
        out.beta(api, &mut headers);
        tracing::debug!(
            read_us = t_read.as_micros() as u64,
            record_us = (t_record - t_read).as_micros() as u64,
            render_us = (t0.elapsed() - t_record).as_micros() as u64,
            "gateway: a request's time before forwarding"
        );
        count(api, "recorded");
        metrics::counter!("ctxd_gateway_tokens_total", "kind" => "client")
            .increment(conv.client_tokens);
        metrics::counter!("ctxd_gateway_tokens_total", "kind" => "forwarded").increment(out.tokens);
        let sink = Sink {
            workflows: self.workflows.clone(),
            api,
            stream: conv.stream,
            model: conv.model.clone(),
            client_tokens: conv.client_tokens,
            forwarded_tokens: out.tokens,
            named: Named {
                session: recorded.session,
                branch: recorded.branch.clone(),
                function: recorded.function.map(|(id, _)| id),
            },
            recording: Recording::Done(Box::new(recorded)),
            verdict: out.verdict,
            gate: None,
            priced_by: self.models.entry(&conv.model).label(),
            asked: out.asked,
            thinking_dropped: out.thinking_dropped,
            saving: out.saving,
        };
        self.forward(api, Method::POST, &uri, &headers, out.body, Some(sink))
            .await
    }

    /// A request located without writing: forwarded at once, its render made in memory, and
    /// recorded beside the upstream call once the upstream has answered (a request that never
    /// reaches it records nothing). The answer's append waits for the recording.
    #[allow(clippy::too_many_arguments)]
    async fn handle_located(
        &self,
        api: Api,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
        call: Call,
        conv: Conversation,
        located: record::Located,
    ) -> Response {
        let (mut conv, mut located) = (conv, located);
        let rendered = self.located_body(api, &mut conv, &mut located, &body).await;
        // A session not made yet keeps its ledger state once it is made.
        let saved = match located.unborn {
            Some(_) => Saved::OnceRecorded,
            None => Saved::Beside,
        };
        // Only what is forwarded is held from here on.
        let mut out = self
            .outgoing(api, &conv, (located.session, None), rendered, body, saved)
            .await;
        let unsaved = out.unsaved.take();
        let mut headers = headers;
        out.beta(api, &mut headers);
        let priced_by = self.models.entry(&conv.model).label();
        count(api, "recorded");
        metrics::counter!("ctxd_gateway_tokens_total", "kind" => "client")
            .increment(conv.client_tokens);
        metrics::counter!("ctxd_gateway_tokens_total", "kind" => "forwarded").increment(out.tokens);
        let (gate, opened) = tokio::sync::oneshot::channel::<()>();
        let (stream, model, client_tokens) = (conv.stream, conv.model.clone(), conv.client_tokens);
        let workflows = self.workflows.clone();
        let (session, branch) = (located.session, located.branch.clone());
        let task = tokio::spawn(async move {
            // The upstream answered (any status): the request is recorded; unreachable, not.
            opened.await.ok()?;
            let mut conv = conv;
            match workflows.record_located(&call, &mut conv, located).await {
                Ok(recorded) => {
                    if let Some(state) = unsaved {
                        state.save(&workflows, (recorded.session, None)).await;
                    }
                    Some(recorded)
                }
                Err(Unrecorded(reason)) => {
                    tracing::info!(reason, "gateway: a forwarded request was not recorded");
                    metrics::counter!("ctxd_gateway_passthrough_total", "reason" => reason)
                        .increment(1);
                    None
                }
            }
        });
        let sink = Sink {
            workflows: self.workflows.clone(),
            api,
            stream,
            model,
            client_tokens,
            forwarded_tokens: out.tokens,
            named: Named {
                session,
                branch,
                function: None,
            },
            recording: Recording::Pending(task),
            verdict: out.verdict,
            gate: Some(gate),
            priced_by,
            asked: out.asked,
            thinking_dropped: out.thinking_dropped,
            saving: out.saving,
        };
        self.forward(api, Method::POST, &uri, &headers, out.body, Some(sink))
            .await
    }

    /// What goes upstream: ctxd's render, judged by the ledger, or the client's body as it
    /// came when no render could be made.
    async fn outgoing(
        &self,
        api: Api,
        conv: &Conversation,
        key: ledger::Key,
        rendered: Result<ForwardedBody, &'static str>,
        body: Bytes,
        saved: Saved,
    ) -> Outgoing {
        match rendered {
            Ok(mut forwarded) => {
                let verdict = self.judge(api, conv, &mut forwarded);
                let (unsaved, saving) = match saved {
                    Saved::OnceRecorded => (Some(forwarded.ledger.clone()), None),
                    Saved::Beside => {
                        let (state, workflows) = (forwarded.ledger.clone(), self.workflows.clone());
                        let saving = tokio::spawn(async move { state.save(&workflows, key).await });
                        (None, Some(saving))
                    }
                };
                Outgoing {
                    unsaved,
                    saving,
                    ..Outgoing::forwarded(forwarded, body, verdict)
                }
            }
            Err(reason) => {
                passthrough(reason);
                Outgoing::as_sent(body, conv)
            }
        }
    }

    /// The ledger's verdict on a forwarded request: what it kept of its conversation's previous
    /// one, and why not the rest, taken into the conversation's state (which [`Saved`] says
    /// when to keep).
    fn judge(
        &self,
        api: Api,
        conv: &Conversation,
        forwarded: &mut ForwardedBody,
    ) -> ledger::Verdict {
        let long_ttl = conv.long_ttl();
        let fixed = (conv.system_tokens as usize + conv.tools_tokens as usize) * 4;
        let now = ledger::Forwarded::new(
            now_ms(),
            long_ttl,
            fixed,
            &forwarded.kept,
            api.cache_markers(),
        );
        forwarded.ledger.record(&now, forwarded.step)
    }
}

/// When a forwarded request's ledger state is saved: always before its answer ends, so the
/// conversation's next call finds it whichever replica serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Saved {
    /// Beside the upstream call, a write off the path to the answer's first byte (the end of
    /// the answer, an error status or a 502 waits for it).
    Beside,
    /// Once it is recorded: its session is made then.
    OnceRecorded,
}

/// What goes upstream for a recorded call, and what its ledger row says of it.
struct Outgoing {
    body: Bytes,
    tokens: u64,
    verdict: Option<ledger::Verdict>,
    asked: Option<AskedEdit>,
    beta: Option<&'static str>,
    thinking_dropped: u32,
    /// The ledger state to save once the request is recorded ([`Saved::OnceRecorded`]).
    unsaved: Option<ledger::State>,
    /// The ledger state being saved beside the upstream call ([`Saved::Beside`]).
    saving: Option<tokio::task::JoinHandle<()>>,
}

impl Outgoing {
    /// The client's request, as it came.
    fn as_sent(body: Bytes, conv: &Conversation) -> Self {
        Self {
            body,
            tokens: conv.client_tokens,
            verdict: None,
            asked: None,
            beta: None,
            thinking_dropped: 0,
            unsaved: None,
            saving: None,
        }
    }

    /// ctxd's body (or the client's, where it changes nothing).
    fn forwarded(forwarded: ForwardedBody, body: Bytes, verdict: ledger::Verdict) -> Self {
        Self {
            body: forwarded.body.map_or(body, Bytes::from),
            tokens: forwarded.tokens,
            verdict: Some(verdict),
            asked: forwarded.asked,
            beta: forwarded.beta,
            thinking_dropped: forwarded.thinking_dropped,
            unsaved: None,
            saving: None,
        }
    }

    /// Adds the header the forwarded body's provider edit needs to the client's headers, as a
    /// value of its own beside theirs.
    fn beta(&self, api: Api, headers: &mut HeaderMap) {
        let needed = self
            .beta
            .and_then(|beta| api.edit_header(beta, &text_headers(headers)));
        if let Some((name, value)) = needed {
            headers.append(name, axum::http::HeaderValue::from_static(value));
        }
    }
}
