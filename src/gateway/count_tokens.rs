//! `count_tokens`: the count of what the gateway would forward, previewed without recording.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use serde_json::Value;

use super::config::{GatewayPolicy, render_options};
use super::{
    Api, App, forward, json, passthrough, read_body, request_policy, session_header,
    with_client_session,
};
use crate::domain::{NodeContent, Tenant};
use crate::provider::conversation::{Conversation, Refusal};

/// `count_tokens` answers for the context the gateway would forward: the stored branch with
/// the request's new messages after it, rendered; nothing is recorded.
pub(super) async fn count_tokens(
    State(app): State<App>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let api = Api::Anthropic;
    let body = match read_body(api, body, app.max_body_bytes).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let tenant = match app.tenant(api, &headers) {
        Ok(t) => t,
        Err(response) => return response,
    };
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return api.invalid("body", &format!("not JSON: {e}")),
    };
    let conv = match api.read(value) {
        Ok(conv) => with_client_session(conv, &headers),
        Err(Refusal::Invalid { field, message }) => return api.invalid(&field, &message),
        Err(Refusal::Unrecordable(reason)) => {
            passthrough(reason);
            return app
                .forward(api, Method::POST, &uri, &headers, body, None)
                .await;
        }
    };
    let policy = match request_policy(app.policy, &headers) {
        Ok(p) => p,
        Err(()) => return api.invalid("x-ctxd-policy", "must be \"stepped\" or \"passthrough\""),
    };
    if policy == GatewayPolicy::Passthrough {
        return app
            .forward(api, Method::POST, &uri, &headers, body, None)
            .await;
    }
    let named = match session_header(&headers) {
        Ok(n) => n,
        Err(()) => return api.invalid("x-ctxd-session", "must be visible ASCII"),
    };
    let forwarded = app
        .counted_body(&tenant, named.as_deref(), &conv, &headers, &body)
        .await;
    let body = forwarded.map_or(body, Bytes::from);
    app.forward(api, Method::POST, &uri, &headers, body, None)
        .await
}

impl App {
    /// The count_tokens body: what the next request's forwarded body would be.
    async fn counted_body(
        &self,
        tenant: &Tenant,
        named: Option<&str>,
        conv: &Conversation,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Option<Vec<u8>> {
        let (entry, window) = self.model(conv, headers);
        let options = render_options(conv, &window, &entry)?;
        let (path, mut rendered) = self.workflows.preview(tenant, named, conv, options).await?;
        let members = json::Members::of(body)?;
        let client = forward::client_entries(&members, "messages");
        let contents: Vec<&NodeContent> = conv.items.iter().map(|i| &i.content).collect();
        let (entries, _) = forward::conversation(
            forward::Format::Anthropic,
            conv,
            &contents,
            client.as_deref(),
            &path,
            &mut rendered.messages,
        );
        members.with_entries("messages", &entries)
    }
}
