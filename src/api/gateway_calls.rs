//! ListGatewayCalls: the model gateway's ledger of a session, call by call, with what the
//! provider's cache read against what the forwarded request kept of the previous one.

use tonic::Request;

use super::parse::{page, session_id};
use super::reply::{self, Capped};
use super::service::{ContextStoreService, Reply, split};
use super::{pb, status};
use crate::domain::{GatewayCall, GatewayCallId};
use crate::provider::models::ModelTable;

/// Calls per page when the request does not say, and at most (as Log's nodes).
const DEFAULT_PAGE_SIZE: u32 = 100;
const MAX_PAGE_SIZE: u32 = 1000;

impl Capped for pb::ListGatewayCallsResponse {
    const ADVICE: &'static str = "ask for a smaller page_size";
}

impl ContextStoreService {
    pub(super) async fn gateway_calls(
        &self,
        request: Request<pb::ListGatewayCallsRequest>,
    ) -> Reply<pb::ListGatewayCallsResponse> {
        let (tenant, r) = split(request);
        let session = session_id(&r.session_id)?;
        let (page_size, after) = page(
            (r.page_size, &r.page_token),
            (DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE),
            GatewayCallId::parse,
        )?;
        let session = self.scope(&tenant, session).await?;
        let (calls, next) = self
            .store
            .gateway_calls(session, page_size, after)
            .await
            .map_err(status)?;
        let response = pb::ListGatewayCallsResponse {
            calls: calls
                .iter()
                .map(|c| call(c, &self.workflows.models))
                .collect(),
            next_page_token: next.map(|id| id.to_string()).unwrap_or_default(),
        };
        reply::capped(response, self.limits.max_response_bytes)
    }
}

fn call(c: &GatewayCall, models: &ModelTable) -> pb::GatewayCall {
    let prices = models.entry(&c.model).prices;
    let u = &c.usage;
    pb::GatewayCall {
        priced_by: c.priced_by.clone(),
        edit_clear: c.asked.map(|a| a.clear),
        edit_keep: c.asked.map(|a| a.keep),
        provider_cleared: u.cleared.map(|(uses, _)| uses),
        provider_cleared_tokens: u.cleared.map(|(_, tokens)| tokens),
        provider_thinking_dropped: u.thinking_dropped,
        thinking_dropped: c.thinking_dropped,
        cost: prices.cost(u.input, u.cache_read, u.cache_write),
        at_unix_ms: c.at_ms,
        api: c.api.clone(),
        model: c.model.clone(),
        client_tokens: c.client_tokens,
        forwarded_tokens: c.forwarded_tokens,
        input_tokens: c.usage.input,
        cache_read_tokens: c.usage.cache_read,
        cache_write_tokens: c.usage.cache_write,
        output_tokens: c.usage.output,
        kept_tokens: c.kept_tokens,
        change: c.change.map(|c| c.as_text()).unwrap_or_default(),
        unexplained_miss: c.unexplained_miss(),
    }
}
