//! AppendStream: many appends over one stream, the requests that arrive together written in
//! one transaction (`Store::append_all`) and acknowledged by one response; the first refused
//! request ends the stream with its status, and nothing sent after it is written.

use std::pin::Pin;

use futures_util::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::parse::append_request;
use super::reply::append_response_len;
use super::service::{ContextStoreService, Reply, split};
use super::{pb, status};
use crate::domain::Tenant;
use crate::store::AppendRequest;

pub type AppendStream =
    Pin<Box<dyn Stream<Item = Result<pb::AppendStreamResponse, Status>> + Send>>;

/// Requests one transaction takes at most (the committer's batch).
const MAX_RUN: usize = 256;

/// Responses held for a client that reads them slowly; past them the stream stops reading.
const BUFFERED: usize = 4;

/// The bytes an `AppendResponse` adds to the stream's response beside its own: its tag and
/// length.
const ENTRY_OVERHEAD: usize = 4;

impl ContextStoreService {
    pub(super) async fn append_stream(
        &self,
        request: Request<Streaming<pb::AppendRequest>>,
    ) -> Reply<AppendStream> {
        let (tenant, input) = split(request);
        let (out, responses) = mpsc::channel(BUFFERED);
        let service = self.clone();
        tokio::spawn(async move { service.run_append_stream(tenant, input, out).await });
        Ok(Response::new(Box::pin(ReceiverStream::new(responses))))
    }

    /// Reads, writes and acknowledges runs of requests until the client ends its side, a
    /// request is refused, the client goes away or the server shuts down.
    async fn run_append_stream(
        &self,
        tenant: Tenant,
        mut input: Streaming<pb::AppendRequest>,
        out: mpsc::Sender<Result<pb::AppendStreamResponse, Status>>,
    ) {
        let mut shutdown = self.watchers.subscribe();
        let max_reply = self.limits.max_response_bytes;
        // Index in the stream of the next request to be read.
        let mut next: u64 = 0;
        // A request read but left for the next run (it would have made the reply too big).
        let mut held: Option<pb::AppendRequest> = None;
        loop {
            let first = match held.take() {
                Some(request) => request,
                None => {
                    let received = tokio::select! {
                        received = input.next() => Some(received),
                        _ = shutdown.wait_for(|stopping| *stopping) => None,
                    };
                    let Some(received) = received else {
                        let _ = out
                            .send(Err(Status::unavailable(
                                "the server is shutting down: open a new stream to another \
                                 server or after the restart; every acknowledged request is \
                                 stored",
                            )))
                            .await;
                        return;
                    };
                    match received {
                        Some(Ok(request)) => request,
                        // The client ended its side (or went away).
                        None => return,
                        Some(Err(e)) => {
                            let _ = out.send(Err(request_error(e))).await;
                            return;
                        }
                    }
                }
            };
            // Every request already here joins the run, as far as one reply can carry.
            let mut run = vec![first];
            let mut reply_len = entry_len(&run[0]);
            let mut ended = None;
            while run.len() < MAX_RUN {
                match input.next().now_or_never() {
                    Some(Some(Ok(request))) => {
                        let len = entry_len(&request);
                        if reply_len + len > max_reply {
                            held = Some(request);
                            break;
                        }
                        reply_len += len;
                        run.push(request);
                    }
                    Some(Some(Err(e))) => {
                        ended = Some(Err(e));
                        break;
                    }
                    Some(None) => {
                        ended = Some(Ok(()));
                        break;
                    }
                    None => break,
                }
            }
            let (acknowledged, refused) = self.write_run(&tenant, next, run).await;
            if !acknowledged.is_empty() {
                let first = next;
                next += acknowledged.len() as u64;
                let response = pb::AppendStreamResponse {
                    first,
                    appends: acknowledged,
                };
                if out.send(Ok(response)).await.is_err() {
                    return;
                }
            }
            if let Some(refusal) = refused {
                let _ = out.send(Err(refusal)).await;
                return;
            }
            match ended {
                Some(Ok(())) => return,
                Some(Err(e)) => {
                    let _ = out.send(Err(request_error(e))).await;
                    return;
                }
                None => {}
            }
        }
    }

    /// Checks and writes one run whose first request is number `first` of the stream: the
    /// answers of those written, and the refusal that stopped the run, if one did.
    async fn write_run(
        &self,
        tenant: &Tenant,
        first: u64,
        run: Vec<pb::AppendRequest>,
    ) -> (Vec<pb::AppendResponse>, Option<Status>) {
        let max_reply = self.limits.max_response_bytes;
        let mut requests: Vec<AppendRequest> = Vec::with_capacity(run.len());
        let mut refused = None;
        for (i, request) in run.into_iter().enumerate() {
            let index = first + i as u64;
            match self.stream_request(tenant, request, max_reply).await {
                Ok(request) => requests.push(request),
                Err(e) => {
                    refused = Some(named(index, e));
                    break;
                }
            }
        }
        if requests.is_empty() {
            return (Vec::new(), refused);
        }
        let outcomes = match self.store.append_all(requests).await {
            Ok(outcomes) => outcomes,
            Err(e) => return (Vec::new(), Some(named(first, status(e)))),
        };
        let mut acknowledged = Vec::with_capacity(outcomes.len());
        for (i, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                Ok(outcome) => {
                    metrics::counter!("ctxd_appended_nodes_total")
                        .increment(outcome.node_ids.len() as u64);
                    acknowledged.push(pb::AppendResponse {
                        node_ids: outcome.node_ids,
                        head_id: outcome.head_id,
                        head_hash: outcome.head_hash,
                    });
                }
                Err(e) => {
                    // The run stopped here: a parse refusal after it was never reached.
                    refused = Some(named(first + i as u64, status(e)));
                    break;
                }
            }
        }
        (acknowledged, refused)
    }

    /// One request of the stream, parsed and scoped as `Append` parses and scopes it.
    async fn stream_request(
        &self,
        tenant: &Tenant,
        request: pb::AppendRequest,
        max_reply: usize,
    ) -> Result<AppendRequest, Status> {
        let len = entry_len(&request);
        if len > max_reply {
            return Err(Status::resource_exhausted(format!(
                "nodes: {}",
                super::reply::too_big_message(len, max_reply, "append fewer nodes per request")
            )));
        }
        let request = append_request(request, self.limits.max_part_bytes)?;
        let session = self.scope(tenant, request.session).await?;
        Ok(request.scoped(session))
    }
}

/// A request the stream could not read, answered as `Append` would be: a broken framing is the
/// caller's (INVALID_ARGUMENT), as the framing layer answers it before a handler runs.
fn request_error(status: Status) -> Status {
    super::framing::broken_framing(&status).unwrap_or(status)
}

/// What acknowledging `request` adds to a response.
fn entry_len(request: &pb::AppendRequest) -> usize {
    append_response_len(request.nodes.len()) + ENTRY_OVERHEAD
}

/// `status` with the request it answers named first, as `requests[N].field: …`.
fn named(index: u64, status: Status) -> Status {
    let message = status.message();
    // A message that starts with a field path (`nodes[0].content: …`) gets the path extended.
    let field = message.split_once(": ").is_some_and(|(path, _)| {
        !path.is_empty()
            && path
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.[]".contains(&b))
    });
    let message = if field {
        format!("requests[{index}].{message}")
    } else {
        format!("requests[{index}]: {message}")
    };
    Status::new(status.code(), message)
}
