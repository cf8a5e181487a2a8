//! One tower layer for the server's hooks that look at each HTTP request and then at its
//! response (metering, the framing rewrite), so each hook says only what it does.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// What a hook does around one call: takes what it needs of the request, then sees the
/// response (or the transport's error) before it goes out.
pub trait Hook: Clone {
    /// What the hook keeps of the request until the response.
    type Seen: Send + 'static;

    fn request<B>(&self, request: &http::Request<B>) -> Self::Seen;

    fn response<R, E>(seen: Self::Seen, response: &mut Result<http::Response<R>, E>);
}

/// The tower layer running hook `H` around every call of the service it wraps.
#[derive(Debug, Clone, Copy, Default)]
pub struct Layer<H>(pub H);

impl<S, H: Hook> tower::Layer<S> for Layer<H> {
    type Service = Hooked<S, H>;

    fn layer(&self, inner: S) -> Self::Service {
        Hooked {
            inner,
            hook: self.0.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Hooked<S, H> {
    inner: S,
    hook: H,
}

impl<S, H, B, R> tower::Service<http::Request<B>> for Hooked<S, H>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    H: Hook,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let seen = self.hook.request(&request);
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await;
            H::response(seen, &mut response);
            response
        })
    }
}
