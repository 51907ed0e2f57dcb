//! The server (HTTP/1.1 and HTTP/2, h2c with prior knowledge on the same cleartext port): the
//! accept loop with graceful shutdown, the operations endpoints
//! (`/healthz`, `/readyz`, `/metrics`) and routing to [`crate::admission`] (a
//! protected route) or [`crate::forward`] (the fallback upstream).
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::json;
use tokio::net::TcpListener;

use crate::body::{BoxBody, text};
use crate::config::{GatewayConfig, RouteConfig};
use crate::exchange::Client;
use crate::metrics::Metrics;
use crate::shutdown::Inflight;
use crate::store::Store;
use crate::{admission, forward, log, purge};

/// What every request handler shares.
#[derive(Debug)]
pub struct Shared {
    /// The validated configuration.
    pub cfg: GatewayConfig,
    /// The routes, shared with the flows.
    pub routes: Vec<Arc<RouteConfig>>,
    /// The store.
    pub store: Store,
    /// The pooled upstream client.
    pub client: Client,
    /// The metrics.
    pub metrics: Metrics,
    /// The flows still running.
    pub inflight: Inflight,
}

impl Shared {
    /// The shared state for `cfg` on `store`.
    #[must_use]
    pub fn new(cfg: GatewayConfig, store: Store) -> Arc<Self> {
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build_http();
        Arc::new(Self {
            routes: cfg.routes.iter().cloned().map(Arc::new).collect(),
            cfg,
            store,
            client,
            metrics: Metrics::default(),
            inflight: Inflight::default(),
        })
    }
}

/// Serves on `listener` until `shutdown` resolves, then stops accepting and gives in-flight
/// requests up to the configured deadline to finish.
pub async fn serve(shared: Arc<Shared>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // Each connection is HTTP/1.1 or HTTP/2, told apart by the HTTP/2 connection preface.
    let server = auto::Builder::new(TokioExecutor::new());
    let purge = tokio::spawn(purge::run(shared.clone()));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        log::warn("accept failed", &[("error", json!(e.to_string()))]);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let s = shared.clone();
                let svc = service_fn(move |req| handle(s.clone(), req));
                let conn = server.serve_connection(TokioIo::new(stream), svc).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    log::info(
        "shutting down",
        &[("in_flight", json!(shared.inflight.count()))],
    );
    let deadline = Duration::from_millis(shared.cfg.shutdown_deadline_ms);
    let finished = tokio::time::timeout(deadline, async {
        graceful.shutdown().await;
        shared.inflight.wait_idle().await;
    })
    .await;
    if finished.is_err() {
        log::warn(
            "shutdown deadline passed with requests in flight",
            &[("in_flight", json!(shared.inflight.count()))],
        );
    }
    purge.abort();
}

/// `GET /healthz`, `/readyz` or `/metrics`: the operations endpoints' answer; `None` for any
/// other request.
pub async fn operations<B>(shared: &Shared, req: &Request<B>) -> Option<Response<BoxBody>> {
    if req.method() != hyper::Method::GET {
        return None;
    }
    Some(match req.uri().path() {
        "/healthz" => text(200, "ok\n"),
        "/readyz" => match shared.store.ping().await {
            Ok(()) => text(200, "ready\n"),
            Err(e) => text(503, format!("store unreachable: {e}\n")),
        },
        "/metrics" => {
            let mut r = text(200, shared.metrics.render());
            if let Ok(v) = hyper::header::HeaderValue::from_str("text/plain; version=0.0.4") {
                r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
            }
            r
        }
        _ => return None,
    })
}

/// Serves the operations endpoints alone on `listener` (`operations_listen`; any other request
/// is 404) until the task is aborted.
pub async fn serve_operations(shared: Arc<Shared>, listener: TcpListener) {
    let server = auto::Builder::new(TokioExecutor::new());
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                log::warn(
                    "operations accept failed",
                    &[("error", json!(e.to_string()))],
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let s = shared.clone();
        let svc = service_fn(move |req: Request<Incoming>| {
            let s = s.clone();
            async move {
                Ok::<_, Infallible>(
                    operations(&s, &req)
                        .await
                        .unwrap_or_else(|| text(404, "not an operations endpoint\n")),
                )
            }
        });
        let conn = server
            .serve_connection(TokioIo::new(stream), svc)
            .into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

/// One request.
///
/// # Errors
/// Never: every failure is an HTTP response.
pub async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<BoxBody>, Infallible> {
    if shared.cfg.operations_listen.is_none() {
        if let Some(answer) = operations(&shared, &req).await {
            return Ok(answer);
        }
    }
    let path = req.uri().path();
    let method = req.method().as_str().to_owned();
    // An exact match first; else a variant of a protected route (another letter case of the
    // method or the path, a trailing slash, ...: `route.rs`) is protected as that route, never
    // forwarded unprotected to the fallback.
    let Some(route) = shared
        .routes
        .iter()
        .find(|r| r.method == method && r.template.matches(path))
        .or_else(|| {
            shared.routes.iter().find(|r| {
                r.method.eq_ignore_ascii_case(&method) && r.template.matches_variant(path)
            })
        })
        .cloned()
    else {
        return Ok(match &shared.cfg.fallback {
            Some(base) => forward::pass_through(&shared, base, req).await,
            None => text(404, "no route\n"),
        });
    };
    Ok(admission::protected(shared, route, req).await)
}
