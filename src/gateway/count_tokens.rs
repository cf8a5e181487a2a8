//! A count of tokens (Anthropic's `count_tokens`, Gemini's `countTokens`): the count of what
//! the gateway would forward, previewed without recording.

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;

use super::call::Parsed;
use super::config::{GatewayPolicy, render_options};
use super::{Api, App, forward, json};
use crate::domain::NodeContent;
use crate::provider::conversation::Conversation;
use crate::workflow::record::Call;

impl App {
    /// A count of tokens answers for the context the gateway would forward: the stored branch
    /// with the request's new messages after it, rendered; nothing is recorded.
    pub(super) async fn count_tokens(
        &self,
        api: Api,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
        Parsed {
            call, policy, conv, ..
        }: Parsed,
    ) -> Response {
        if policy == GatewayPolicy::Passthrough {
            return self
                .forward(api, Method::POST, &uri, &headers, body, None)
                .await;
        }
        let forwarded = self.counted_body(api, &call, &conv, &body).await;
        let body = forwarded.map_or(body, Bytes::from);
        self.forward(api, Method::POST, &uri, &headers, body, None)
            .await
    }

    /// The count_tokens body: what the next request's forwarded body would be.
    async fn counted_body(
        &self,
        api: Api,
        call: &Call,
        conv: &Conversation,
        body: &[u8],
    ) -> Option<Vec<u8>> {
        let (entry, window) = self.model(conv);
        let options = render_options(conv, &window, &entry)?;
        let (path, mut rendered) = self.workflows.preview(call, conv, options).await?;
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
