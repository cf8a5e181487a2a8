//! Forwarding upstream and relaying the answer to the client chunk by chunk, assembling it on the
//! way so a whole answer can be appended.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, Method, Uri};
use axum::response::Response;
use tokio::sync::mpsc;

use super::answer::Sink;
use super::{Api, App, count, refuse};
use crate::provider::codec::{Failure, Upstream};

/// Headers never forwarded either way: hop-by-hop ones, those the HTTP stack sets, ctxd's own.
/// `accept-encoding` too: the gateway reads the answer it relays, so it asks for it plain.
const DROPPED: &[&str] = &[
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "accept-encoding",
];

impl App {
    /// Sends `body` upstream and relays the answer as it arrives; with a `sink`, the answer is
    /// assembled on the way and appended once whole.
    pub(super) async fn forward(
        &self,
        api: Api,
        method: Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: Bytes,
        sink: Option<Sink>,
    ) -> Response {
        let base = match api.upstream() {
            Upstream::Anthropic => &self.anthropic,
            Upstream::OpenAi => &self.openai,
            Upstream::Google => &self.google,
        };
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let url = format!("{base}{path}");
        let mut request = self.http.request(method, &url).body(body);
        for (name, value) in headers {
            if forwarded(name) {
                request = request.header(name, value);
            }
        }
        let mut sink = sink;
        let upstream = match request.send().await {
            Ok(r) => {
                if let Some(gate) = sink.as_mut().and_then(|s| s.gate.take()) {
                    let _ = gate.send(());
                }
                r
            }
            Err(e) => {
                tracing::warn!(api = api.name(), error = %without_url(&e), "gateway: the upstream cannot be reached");
                count(api, "upstream_unreachable");
                let mut response = refuse(
                    api,
                    Failure::Upstream,
                    &format!(
                        "the ctxd gateway could not reach the upstream: {}",
                        without_url(&e)
                    ),
                    None,
                );
                // The client can still find the session its request went to, and retries once
                // the conversation's state is kept.
                if let Some(sink) = sink.as_mut() {
                    sink.name(response.headers_mut());
                    sink.saved().await;
                }
                return response;
            }
        };
        // A request located before forwarding is recorded now that the upstream has answered;
        // the answer names where it went, which a call racing it may have changed (a fork, or
        // the session another call made first for the same key).
        if let Some(sink) = sink.as_mut()
            && let Some(recorded) = sink.recording.get().await
        {
            sink.named.session = recorded.session;
            sink.named.branch = recorded.branch.clone();
        }
        let status = upstream.status();
        let mut response = Response::builder().status(status);
        if let Some(h) = response.headers_mut() {
            for (name, value) in upstream.headers() {
                if forwarded(name) || name == "content-length" {
                    h.append(name, value.clone());
                }
            }
            if let Some(sink) = &sink {
                sink.name(h);
            }
        }
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
        tokio::spawn(relay(upstream, tx, sink, status.is_success()));
        let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        response.body(body).unwrap_or_else(|_| {
            refuse(
                api,
                Failure::Upstream,
                "the upstream's answer could not be relayed",
                None,
            )
        })
    }
}

fn forwarded(name: &HeaderName) -> bool {
    let n = name.as_str();
    !DROPPED.contains(&n) && !n.starts_with("x-ctxd-")
}

/// A transport error without its URL, which may carry credentials in a query.
fn without_url(e: &reqwest::Error) -> String {
    let mut e = e.to_string();
    if let Some(i) = e.find(" for url") {
        e.truncate(i);
    }
    e
}

/// Relays the upstream's body to the client chunk by chunk. A client that goes away ends the
/// relay and drops the upstream call; a cut upstream cuts the client's answer too; only a
/// whole answer is appended. The chunk that ends a recorded answer (its terminal event; for a
/// whole JSON body, the last chunk) is held until the answer is appended and the conversation's
/// ledger state kept, so a client that has the whole answer finds it in the session, and its
/// next request never races either write.
async fn relay(
    mut upstream: reqwest::Response,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    mut sink: Option<Sink>,
    answered: bool,
) {
    // An error status is relayed as it came; only an answer is assembled and appended.
    let mut assembly = sink
        .as_ref()
        .filter(|_| answered)
        .map(|s| s.api.answer(s.stream));
    let streamed = sink.as_ref().is_none_or(|s| s.stream);
    // An error is relayed as it comes, so it waits for the conversation's state to be kept; an
    // answer waits for it only at its end.
    if !answered && let Some(sink) = sink.as_mut() {
        sink.saved().await;
    }
    let mut held: Vec<Bytes> = Vec::new();
    loop {
        match upstream.chunk().await {
            Ok(Some(bytes)) => {
                let Some(a) = assembly.as_mut() else {
                    if tx.send(Ok(bytes)).await.is_err() {
                        return gone();
                    }
                    continue;
                };
                a.feed(&bytes);
                let out = if streamed {
                    if a.complete() || !held.is_empty() {
                        held.push(bytes);
                        continue;
                    }
                    vec![bytes]
                } else {
                    // A whole body ends with its last chunk: keep one chunk back.
                    std::mem::replace(&mut held, vec![bytes])
                };
                for b in out {
                    if tx.send(Ok(b)).await.is_err() {
                        return gone();
                    }
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %without_url(&e), "gateway: the upstream's answer was cut");
                // The client sees the end once its request is recorded, whatever the end.
                if let Some(sink) = sink.as_mut() {
                    sink.recording.get().await;
                    sink.saved().await;
                }
                for b in held {
                    let _ = tx.send(Ok(b)).await;
                }
                let _ = tx
                    .send(Err(std::io::Error::other("the upstream's answer was cut")))
                    .await;
                return;
            }
        }
    }
    let answer = match (&sink, assembly) {
        (Some(_), Some(assembly)) => assembly.finish(),
        _ => None,
    };
    if let Some(sink) = sink.as_mut() {
        match &answer {
            Some((Some(content), _)) => sink.append(content.clone()).await,
            _ => {
                sink.recording.get().await;
            }
        }
        sink.saved().await;
    }
    for b in held {
        if tx.send(Ok(b)).await.is_err() {
            break;
        }
    }
    drop(tx);
    match (sink, answer) {
        (Some(sink), Some((_, usage))) => sink.usage(usage).await,
        (Some(_), None) if answered => {
            tracing::info!("gateway: an answer that is not whole is not recorded");
        }
        _ => {}
    }
}

fn gone() {
    tracing::debug!("gateway: the client went away; the upstream call is dropped");
}
