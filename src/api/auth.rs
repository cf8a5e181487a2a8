//! The tower layer that authenticates every RPC but health checks and hands each request the
//! [`Tenant`] it acts for (who a caller is: [`crate::auth`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::AUTHORIZATION;
use tonic::Status;

use crate::auth::{Admin, ApiKeys};
use crate::auth::{Key, Refusal, keyed};
use crate::domain::Tenant;

/// Paths that need no key: load balancers and orchestrators probe health without credentials.
/// tonic routes by this same service prefix, so an exempt path reaches the health service only.
const EXEMPT_PREFIX: &str = "/grpc.health.v1.Health/";

/// Authenticates requests by API key (when keys are configured) and puts the caller's [`Tenant`]
/// into the request's extensions: the key's tenant, or [`Tenant::local`] without keys. Health
/// checks need no key and get no tenant when keys are configured.
#[derive(Debug, Clone, Default)]
pub struct AuthLayer {
    keys: Option<Arc<ApiKeys>>,
}

impl AuthLayer {
    pub fn new(keys: Option<ApiKeys>) -> Self {
        Self {
            keys: keys.map(Arc::new),
        }
    }

    /// Keys shared with another way in (the inspector's HTTP server).
    pub fn shared(keys: Option<Arc<ApiKeys>>) -> Self {
        Self { keys }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Auth {
            inner,
            keys: self.keys.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Auth<S> {
    inner: S,
    keys: Option<Arc<ApiKeys>>,
}

impl<S, B, R> tower::Service<http::Request<B>> for Auth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        match authenticate(self.keys.as_deref(), &mut request) {
            Ok(()) => Box::pin(self.inner.call(request)),
            Err(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
        }
    }
}

fn authenticate<B>(keys: Option<&ApiKeys>, request: &mut http::Request<B>) -> Result<(), Status> {
    let path = request.uri().path();
    let key = match keys {
        None => Some(Key {
            tenant: Tenant::local(),
            admin: true,
        }),
        Some(_) if path.starts_with(EXEMPT_PREFIX) => None,
        Some(keys) => Some(keyed(keys, request.headers(), path).map_err(unauthenticated)?),
    };
    // Handlers get the tenant, never the credential: nothing past here can log it.
    request.headers_mut().remove(AUTHORIZATION);
    if let Some(key) = key {
        request.extensions_mut().insert(key.tenant);
        if key.admin {
            request.extensions_mut().insert(Admin);
        }
    }
    Ok(())
}

/// A refusal as the status every RPC answers it with.
pub fn unauthenticated(refusal: Refusal) -> Status {
    Status::unauthenticated(refusal.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tenant of the key reaches the service behind the layer, and the credential does not.
    #[tokio::test]
    async fn the_keys_tenant_reaches_the_service_without_the_header() {
        use tower::{Layer, Service};

        #[derive(Clone)]
        struct Echo;
        impl Service<http::Request<()>> for Echo {
            type Response = http::Response<String>;
            type Error = std::convert::Infallible;
            type Future = std::future::Ready<Result<Self::Response, Self::Error>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, request: http::Request<()>) -> Self::Future {
                let tenant = request.extensions().get::<Tenant>().cloned();
                let header = request.headers().contains_key(AUTHORIZATION);
                std::future::ready(Ok(http::Response::new(format!("{tenant:?} {header}"))))
            }
        }
        let request = |path: &str, auth: Option<&str>| {
            let mut builder = http::Request::builder().uri(path);
            if let Some(auth) = auth {
                builder = builder.header(AUTHORIZATION, auth);
            }
            builder.body(()).expect("request")
        };
        let keys = ApiKeys::parse("acme k1\nglobex k2\n").expect("valid");
        let mut service = AuthLayer::new(Some(keys)).layer(Echo);
        let body = |r: http::Response<String>| r.into_body();
        let rpc = "/ctxd.v1.ContextStore/CreateSession";

        let answer = service.call(request(rpc, Some("Bearer k2"))).await;
        assert_eq!(body(answer.unwrap()), r#"Some(Tenant("globex")) false"#);
        let answer = service
            .call(request("/grpc.health.v1.Health/Check", None))
            .await;
        assert_eq!(body(answer.unwrap()), "None false");
        let refused = service.call(request(rpc, Some("Bearer k3"))).await.unwrap();
        assert_eq!(refused.headers()["grpc-status"], "16");
        assert_eq!(body(refused), "");

        let mut open = AuthLayer::new(None).layer(Echo);
        let answer = open.call(request(rpc, None)).await;
        assert_eq!(body(answer.unwrap()), r#"Some(Tenant("")) false"#);
    }
}
