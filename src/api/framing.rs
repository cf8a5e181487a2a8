//! Requests whose gRPC framing is broken answer INVALID_ARGUMENT, not tonic's INTERNAL.

use tonic::{Code, Status};

/// How tonic words a request whose length-prefixed framing is broken, before any handler runs:
/// a compressed flag that is invalid or names no `grpc-encoding`, a body that ends inside a
/// message, a unary call that carries none. tonic answers these INTERNAL (for the flag, as the
/// gRPC compression spec words it), but only a caller can cause them: they say nothing about
/// the server. The prefixes are pinned by the request fuzzer, which sends all four.
const FRAMING_ERRORS: [&str; 3] = [
    "protocol error: received message with",
    "Unexpected EOF decoding stream",
    "Missing request message",
];

/// `status` as INVALID_ARGUMENT if it is tonic's word for a broken framing, else `None`. Also
/// for a stream whose handler met it after answering (AppendStream), where the layer cannot.
pub(super) fn broken_framing(status: &Status) -> Option<Status> {
    (status.code() == Code::Internal
        && FRAMING_ERRORS
            .iter()
            .any(|p| status.message().starts_with(p)))
    .then(|| {
        Status::invalid_argument(format!(
            "request: its gRPC framing is broken: {}",
            status.message()
        ))
    })
}

/// The hook (under `crate::hook::Layer`) that answers tonic's framing errors INVALID_ARGUMENT.
#[derive(Debug, Clone, Copy, Default)]
pub struct Framing;

impl crate::hook::Hook for Framing {
    type Seen = ();

    fn request<B>(&self, _: &http::Request<B>) {}

    fn response<R, E>((): (), response: &mut Result<http::Response<R>, E>) {
        let Ok(response) = response else {
            return;
        };
        // A request that fails before its handler answers trailers-only: the status is in the
        // head.
        let headers = response.headers_mut();
        if let Some(status) = Status::from_header_map(headers)
            && let Some(status) = broken_framing(&status)
            && status.add_header(headers).is_err()
        {
            tracing::warn!("could not rewrite a framing error");
        }
    }
}
