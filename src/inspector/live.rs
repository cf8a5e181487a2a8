//! `/api/sessions/{id}/events`: a session followed live, as server-sent events fed by the Watch
//! RPC. Each event's `id` is its Watch cursor, so a browser that reconnects with
//! `Last-Event-ID` (or `?after_cursor=`) resumes right after the last event it saw.

use std::convert::Infallible;

use axum::http::HeaderValue;
use axum::http::header::CACHE_CONTROL;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use serde_json::json;

use super::{Answer, OnSession, bad, failure, rpc, screaming};
use crate::proto::json::ToJson;
use crate::proto::pb;
use pb::watch_event::Event as Watched;

pub(super) async fn events(call: OnSession) -> Answer {
    let q = call.query(&["branch", "after_cursor"])?;
    // A reconnecting EventSource (or a client doing as one does) names the last event it saw.
    let resume = call
        .request
        .headers()
        .get("last-event-id")
        .map(|v| {
            v.to_str()
                .map(str::to_owned)
                .map_err(|_| bad("header Last-Event-ID: not a cursor".to_owned()))
        })
        .transpose()?;
    let message = pb::WatchRequest {
        session_id: call.id,
        branch: q.string("branch"),
        after_cursor: resume.unwrap_or_else(|| q.string("after_cursor")),
        after_node_id: String::new(),
    };
    let watch = call
        .app
        .service
        .watch(rpc(&call.request, message))
        .await
        .map_err(|s| failure(&s))?;
    // An error ends the stream after it is told: the Watch stream has ended too.
    let events = watch
        .scan(false, |ended, item| {
            let out = if *ended {
                None
            } else {
                *ended = item.is_err();
                Some(Ok::<_, Infallible>(event(item)))
            };
            std::future::ready(out)
        })
        .boxed();
    let mut response: Response = Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response();
    // Session content is private to its tenant: no shared cache may keep it.
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// A Watch event as `id: CURSOR`, `event: NAME`, `data: JSON` (the JSON of `ctxd watch --json`).
fn event(item: Result<pb::WatchEvent, tonic::Status>) -> Event {
    match item {
        Ok(watched) => {
            let name = match &watched.event {
                Some(Watched::Started(_)) => "started",
                Some(Watched::Node(_)) => "node",
                Some(Watched::HeadMoved(_)) => "head_moved",
                Some(Watched::BranchCreated(_)) => "branch_created",
                Some(Watched::BranchDeleted(_)) => "branch_deleted",
                Some(Watched::Compaction(_)) => "compaction",
                Some(Watched::Deleted(_)) => "deleted",
                None => "unknown",
            };
            let mut event = Event::default()
                .event(name)
                .data(watched.to_json().to_string());
            // A cursor is printable ASCII; anything else could not be sent back as a header.
            if !watched.cursor.is_empty() && watched.cursor.bytes().all(|b| b.is_ascii_graphic()) {
                event = event.id(watched.cursor);
            }
            event
        }
        Err(status) => {
            let code = screaming(&format!("{:?}", status.code()));
            Event::default()
                .event("error")
                .data(json!({"error": {"code": code, "message": status.message()}}).to_string())
        }
    }
}
