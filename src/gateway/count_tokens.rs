//! A count of tokens (Anthropic's `count_tokens`, Gemini's `countTokens`): the count of what
//! the gateway would forward, previewed without recording.

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use serde_json::Value;

use super::config::{GatewayPolicy, render_options};
use super::{
    Api, App, forward, invalid, json, passthrough, request_policy, session_header,
    with_client_session,
};
use crate::domain::{NodeContent, Tenant};
use crate::provider::codec::Request;
use crate::provider::conversation::{Conversation, Refusal};

impl App {
    /// A count of tokens answers for the context the gateway would forward: the stored branch
    /// with the request's new messages after it, rendered; nothing is recorded.
    pub(super) async fn count_tokens(
        &self,
        api: Api,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        let tenant = match self.tenant(api, &headers) {
            Ok(t) => t,
            Err(response) => return response,
        };
        let value: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return invalid(api, "body", &format!("not JSON: {e}")),
        };
        let read = api.read(Request {
            path: uri.path(),
            body: value,
        });
        let conv = match read {
            Ok(conv) => with_client_session(conv, &headers),
            Err(Refusal::Invalid { field, message }) => return invalid(api, &field, &message),
            Err(Refusal::Unrecordable(reason)) => {
                passthrough(reason);
                return self
                    .forward(api, Method::POST, &uri, &headers, body, None)
                    .await;
            }
        };
        let policy = match request_policy(self.policy, &headers) {
            Ok(p) => p,
            Err(()) => {
                return invalid(
                    api,
                    "x-ctxd-policy",
                    "must be \"stepped\" or \"passthrough\"",
                );
            }
        };
        if policy == GatewayPolicy::Passthrough {
            return self
                .forward(api, Method::POST, &uri, &headers, body, None)
                .await;
        }
        let named = match session_header(&headers) {
            Ok(n) => n,
            Err(()) => return invalid(api, "x-ctxd-session", "must be visible ASCII"),
        };
        let forwarded = self
            .counted_body(api, &tenant, named.as_deref(), &conv, &headers, &body)
            .await;
        let body = forwarded.map_or(body, Bytes::from);
        self.forward(api, Method::POST, &uri, &headers, body, None)
            .await
    }

    /// The count_tokens body: what the next request's forwarded body would be.
    async fn counted_body(
        &self,
        api: Api,
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
        let client = forward::client_entries(&members, api.field());
        let contents: Vec<&NodeContent> = conv.items.iter().map(|i| &i.content).collect();
        let (entries, _) = forward::conversation(
            api,
            conv,
            &contents,
            client.as_deref(),
            &path,
            &mut rendered.messages,
        );
        members.with_entries(api.field(), &entries)
    }
}
