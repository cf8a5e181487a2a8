//! Admission to the ContextStore service: the request size limit, the concurrency limit with
//! load shedding, and refusing new calls while the server shuts down.
//!
//! Health checking is not behind any of this, so an orchestrator always sees the truth.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};
use tokio::sync::Semaphore;
use tonic::Status;
use tonic::body::Body;
use tonic::server::NamedService;
use tower::ServiceExt;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower::load_shed::error::Overloaded;

const MIB: usize = 1024 * 1024;

/// The server's size and concurrency limits (`ctxd serve --max-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest request message (an `ImportSession` stream: each chunk).
    pub max_request_bytes: usize,
    /// The largest single part of a node: a text or media part, tool call arguments, a
    /// function's input or output.
    pub max_part_bytes: usize,
    /// The largest response message; a bigger one is refused before anything is sent.
    pub max_response_bytes: usize,
    /// Calls served at once; past it a call is refused at once, not queued.
    pub max_concurrent_requests: usize,
    /// How long a Watch stream may stay full (its client reads nothing) before it is ended
    /// with RESOURCE_EXHAUSTED and the cursor to resume from.
    pub watch_fall_behind: Duration,
}

impl Limits {
    pub const DEFAULT_MAX_REQUEST_BYTES: usize = 16 * MIB;
    pub const DEFAULT_MAX_PART_BYTES: usize = 8 * MIB;
    /// Larger than requests: a response gathers many writes (a whole rendered path), and media
    /// parts weigh 1,024 tokens whatever their bytes, so a budget does not shrink them. 64 MiB
    /// is also what the `ctxd` command line accepts.
    pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 64 * MIB;
    pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 512;
    pub const DEFAULT_WATCH_FALL_BEHIND: Duration = Duration::from_secs(30);
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_request_bytes: Self::DEFAULT_MAX_REQUEST_BYTES,
            max_part_bytes: Self::DEFAULT_MAX_PART_BYTES,
            max_response_bytes: Self::DEFAULT_MAX_RESPONSE_BYTES,
            max_concurrent_requests: Self::DEFAULT_MAX_CONCURRENT_REQUESTS,
            watch_fall_behind: Self::DEFAULT_WATCH_FALL_BEHIND,
        }
    }
}

/// Why [`Admission`] refuses a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The server is shutting down.
    Draining,
    /// Every slot is taken.
    Full,
}

const DRAINING: &str = "the server is shutting down and takes no new calls; retry on another \
                        instance or after it restarts";

/// Admission shared by every service it wraps: one pool of permits, one draining flag.
#[derive(Debug, Clone)]
pub struct Admission {
    permits: Arc<Semaphore>,
    max_concurrent: u32,
    max_request_bytes: usize,
    draining: Arc<AtomicBool>,
}

impl Admission {
    pub fn new(limits: &Limits) -> Self {
        // `acquire_many` counts in u32; a limit past that is no limit anyway.
        let max_concurrent =
            u32::try_from(limits.max_concurrent_requests.max(1)).unwrap_or(u32::MAX);
        Self {
            permits: Arc::new(Semaphore::new(max_concurrent as usize)),
            max_concurrent,
            max_request_bytes: limits.max_request_bytes,
            draining: Arc::default(),
        }
    }

    /// Wraps `service`: calls past the concurrency limit, calls while draining and request
    /// messages over the size limit are answered with a status, never passed on.
    pub fn wrap<S>(&self, service: S) -> Admitted<S>
    where
        S: NamedService,
    {
        let limited = tower::ServiceBuilder::new()
            .layer(LoadShedLayer::new())
            .layer(GlobalConcurrencyLimitLayer::with_semaphore(Arc::clone(
                &self.permits,
            )))
            .service(service);
        Admitted {
            inner: limited,
            admission: self.clone(),
        }
    }

    /// From now on new calls are refused with UNAVAILABLE; calls in flight go on.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Admits one call of another front door (the inspector's HTTP API) under the same limit:
    /// the permit is the call's slot until it is dropped.
    pub fn try_admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Status> {
        self.admit().map_err(|refused| match refused {
            Refused::Draining => Status::unavailable(DRAINING),
            Refused::Full => self.overloaded(),
        })
    }

    /// [`Admission::try_admit`] for a door that answers in its own words (the gateway): why a
    /// call is refused, and [`Admission::refusal`] to say it.
    pub fn admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Refused> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(Refused::Draining);
        }
        Arc::clone(&self.permits)
            .try_acquire_owned()
            .map_err(|_| Refused::Full)
    }

    /// What a refused call is told.
    pub fn refusal(&self, refused: Refused) -> String {
        match refused {
            Refused::Draining => DRAINING.to_owned(),
            Refused::Full => self.overloaded().message().to_owned(),
        }
    }

    /// Calls admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        (self.max_concurrent as usize).saturating_sub(self.permits.available_permits())
    }

    /// Resolves once no admitted call is in flight (every permit is back).
    pub async fn idle(&self) {
        // The semaphore is never closed, so this only waits.
        let _all = self.permits.acquire_many(self.max_concurrent).await;
    }

    fn overloaded(&self) -> Status {
        Status::resource_exhausted(format!(
            "the server is serving its limit of {} calls at once (--max-concurrent-requests); \
             retry with backoff",
            self.max_concurrent
        ))
    }
}

type Limited<S> = tower::load_shed::LoadShed<tower::limit::ConcurrencyLimit<S>>;

/// A service behind [`Admission`]; keeps the wrapped service's name for routing.
#[derive(Debug, Clone)]
pub struct Admitted<S> {
    inner: Limited<S>,
    admission: Admission,
}

impl<S: NamedService> NamedService for Admitted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower::Service<http::Request<Body>> for Admitted<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send + 'static>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is decided per call below (load shedding answers at once instead of
        // making the caller wait), so this service is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let admission = self.admission.clone();
        if admission.draining.load(Ordering::SeqCst) {
            let status = Status::unavailable(DRAINING);
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let max = admission.max_request_bytes;
        let request = request.map(|body| Body::new(MessageSizeLimit::new(body, max)));
        let call = self.inner.clone().oneshot(request);
        Box::pin(async move {
            match call.await {
                Ok(response) => Ok(response),
                Err(e) if e.is::<Overloaded>() => Ok(admission.overloaded().into_http()),
                // The wrapped service is infallible and the limit layers fail only by
                // shedding; should that change, the caller still gets a status, not a reset.
                Err(e) => Ok(Status::from_error(e).into_http()),
            }
        })
    }
}

/// A request body that fails as soon as a gRPC message header announces more than `max`
/// bytes, before the message is read, with RESOURCE_EXHAUSTED naming the limit. tonic's own
/// check would answer OUT_OF_RANGE, which clients do not read as "too large".
struct MessageSizeLimit {
    inner: Body,
    max: usize,
    /// Bytes of the current message header seen so far (a header may span data frames).
    header: [u8; 5],
    header_len: usize,
    /// Bytes of the current message still to come.
    payload_left: usize,
    failed: bool,
}

impl MessageSizeLimit {
    fn new(inner: Body, max: usize) -> Self {
        Self {
            inner,
            max,
            header: [0; 5],
            header_len: 0,
            payload_left: 0,
            failed: false,
        }
    }

    /// Walks the message framing (1 flag byte, 4 length bytes, the message) over `data`.
    fn check(&mut self, data: &[u8]) -> Result<(), Status> {
        let mut rest = data;
        while !rest.is_empty() {
            if self.payload_left > 0 {
                let take = self.payload_left.min(rest.len());
                self.payload_left -= take;
                rest = &rest[take..];
                continue;
            }
            self.header[self.header_len] = rest[0];
            self.header_len += 1;
            rest = &rest[1..];
            if self.header_len == self.header.len() {
                self.header_len = 0;
                let [_, a, b, c, d] = self.header;
                let len = u32::from_be_bytes([a, b, c, d]) as usize;
                if len > self.max {
                    return Err(Status::resource_exhausted(format!(
                        "the request message is {len} bytes, over the server's limit of {} \
                         (--max-request-bytes); send less in one message (fewer nodes per \
                         Append, smaller ImportSession chunks)",
                        self.max
                    )));
                }
                self.payload_left = len;
            }
        }
        Ok(())
    }
}

impl HttpBody for MessageSizeLimit {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if let Some(data) = frame.data_ref()
            && let Err(status) = self.check(data)
        {
            self.failed = true;
            return Poll::Ready(Some(Err(status)));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: u32) -> Vec<u8> {
        let mut f = vec![0u8];
        f.extend_from_slice(&len.to_be_bytes());
        f.extend(std::iter::repeat_n(7u8, len as usize));
        f
    }

    #[test]
    fn messages_up_to_the_limit_pass_in_any_split() {
        let stream: Vec<u8> = [frame(10), frame(0), frame(10)].concat();
        for split in 0..stream.len() {
            let mut limit = MessageSizeLimit::new(Body::default(), 10);
            let (a, b) = stream.split_at(split);
            assert!(
                limit.check(a).is_ok() && limit.check(b).is_ok(),
                "split {split}"
            );
        }
    }

    #[test]
    fn a_header_over_the_limit_fails_even_split_across_frames() {
        let stream: Vec<u8> = [frame(3), frame(11)].concat();
        for split in 0..=8 + 5 {
            let mut limit = MessageSizeLimit::new(Body::default(), 10);
            let (a, b) = stream.split_at(split);
            let status = limit
                .check(a)
                .and_then(|()| limit.check(b))
                .expect_err("11 > 10");
            assert_eq!(status.code(), tonic::Code::ResourceExhausted);
            assert!(status.message().contains("--max-request-bytes"));
        }
    }
}
