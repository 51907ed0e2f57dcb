//! The HTTP/1.1 server: routing, core's admission (key, body, fingerprint, scope), then the
//! flow driver for admitted requests; pass-through for requests core lets through unprotected;
//! the operations endpoints; graceful shutdown.
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use idempo_core::fingerprint::RequestParts;
use idempo_core::machine::{
    BodyRead, BodyStage, KeyStage, Refusal, ScopeResolution, ScopeRule, ScopeStage, admit,
};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::body::{BoxBody, full, is_hop_by_hop, text, to_hyper};
use crate::config::{GatewayConfig, RouteConfig};
use crate::exchange::{Client, strip_hop_by_hop};
use crate::metrics::Metrics;
use crate::shutdown::Inflight;
use crate::store::Store;
use crate::{driver, log, purge};

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
                let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
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

/// One request.
///
/// # Errors
/// Never: every failure is an HTTP response.
pub async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<BoxBody>, Infallible> {
    let path = req.uri().path();
    if req.method() == hyper::Method::GET {
        match path {
            "/healthz" => return Ok(text(200, "ok\n")),
            "/readyz" => {
                return Ok(match shared.store.ping().await {
                    Ok(()) => text(200, "ready\n"),
                    Err(e) => text(503, format!("store unreachable: {e}\n")),
                });
            }
            "/metrics" => {
                let mut r = text(200, shared.metrics.render());
                if let Ok(v) = hyper::header::HeaderValue::from_str("text/plain; version=0.0.4") {
                    r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
                }
                return Ok(r);
            }
            _ => {}
        }
    }
    let method = req.method().as_str().to_owned();
    let Some(route) = shared
        .routes
        .iter()
        .find(|r| r.method == method && r.template.matches(path))
        .cloned()
    else {
        return Ok(match &shared.cfg.fallback {
            Some(base) => pass_through(&shared, base, req).await,
            None => text(404, "no route\n"),
        });
    };
    Ok(protected(shared, route, req).await)
}

fn refuse(shared: &Shared, route: &RouteConfig, r: Refusal) -> Response<BoxBody> {
    shared.metrics.request(route.template.as_str(), r.outcome());
    log::info(
        "request",
        &[
            ("route", json!(route.template.as_str())),
            ("outcome", json!(r.outcome())),
            ("status", json!(r.response.status)),
        ],
    );
    if let Some(line) = &r.log {
        log::error(line, &[("route", json!(route.template.as_str()))]);
    }
    to_hyper(r.response)
}

async fn protected(
    shared: Arc<Shared>,
    route: Arc<RouteConfig>,
    req: Request<Incoming>,
) -> Response<BoxBody> {
    let config = &route.config;
    let stage = {
        let key_fields: Vec<&[u8]> = req
            .headers()
            .get_all(shared.cfg.header_name.as_str())
            .iter()
            .map(hyper::header::HeaderValue::as_bytes)
            .collect();
        let declared = req
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        admit(config, &key_fields, declared)
    };
    let awaiting = match stage {
        KeyStage::PassThrough => return pass_through(&shared, &route.upstream_base, req).await,
        KeyStage::Refuse(r) => return refuse(&shared, &route, r),
        KeyStage::Continue(a) => a,
    };
    let (parts, mut body) = req.into_parts();
    let limit = awaiting.body_limit();
    let timeout = Duration::from_millis(shared.cfg.upstream_timeout_ms);
    let mut buf: Vec<u8> = Vec::new();
    let mut read: u64 = 0;
    let mut over = false;
    let mut broken = false;
    loop {
        match tokio::time::timeout(timeout, body.frame()).await {
            Ok(None) => break,
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    read = read.saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
                    if buf.len().saturating_add(data.len()) > limit {
                        over = true;
                        break;
                    }
                    buf.extend_from_slice(&data);
                }
            }
            Ok(Some(Err(_))) | Err(_) => {
                broken = true;
                break;
            }
        }
    }
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned());
    let header_pairs: Vec<(&str, &str)> = parts
        .headers
        .iter()
        .filter_map(|(n, v)| v.to_str().ok().map(|v| (n.as_str(), v)))
        .collect();
    let content_type = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let read_result = if over {
        BodyRead::OverLimit { read }
    } else if broken {
        BodyRead::Unavailable {
            fix: "The client's request body could not be read whole (its connection failed or \
                  stalled); send the request again.",
        }
    } else {
        BodyRead::Complete(RequestParts {
            method: parts.method.as_str(),
            route: &target,
            headers: &header_pairs,
            content_type,
            body: &buf,
        })
    };
    let scope_stage = match awaiting.body(read_result, &route.fingerprinter) {
        Ok(BodyStage::Refuse(r)) => return refuse(&shared, &route, r),
        Ok(BodyStage::Continue(s)) => s,
        Err(e) => {
            log::error(
                "fingerprint failed",
                &[
                    ("route", json!(route.template.as_str())),
                    ("error", json!(e.to_string())),
                ],
            );
            return to_hyper(idempo_core::machine::problem::problem_response(
                idempo_core::machine::problem::ProblemKind::InvalidBody,
                Some(&e.to_string()),
                None,
                None,
            ));
        }
    };
    let principal_value;
    let resolution = match (route.scope_rule, &shared.cfg.principal_header) {
        (ScopeRule::Function { .. }, Some(h)) => {
            let mut values = parts.headers.get_all(h.as_str()).iter();
            match (values.next(), values.next()) {
                (None, _) => {
                    principal_value = format!("no {h} header");
                    ScopeResolution::Nothing(&principal_value)
                }
                // Several principal fields: which one the auth proxy set is unknown; refuse.
                (Some(_), Some(_)) => {
                    principal_value = format!("several {h} headers");
                    ScopeResolution::NotAString(&principal_value)
                }
                (Some(v), None) => match v.to_str() {
                    Ok(p) => ScopeResolution::Principal(p),
                    Err(_) => {
                        ScopeResolution::NotAString("a header value that is not visible ASCII")
                    }
                },
            }
        }
        _ => ScopeResolution::NotCalled,
    };
    let admitted = match scope_stage.scope(
        route.scope_rule,
        resolution,
        false,
        &route.method,
        route.template.as_str(),
    ) {
        ScopeStage::Refuse(r) => return refuse(&shared, &route, r),
        ScopeStage::Admitted(a) => a,
    };
    let upstream = match upstream_request(&route.upstream_base, &parts, full(Bytes::from(buf))) {
        Ok(r) => r,
        Err(e) => {
            log::error("bad upstream URI", &[("error", json!(e))]);
            return text(500, "bad upstream URI\n");
        }
    };
    let (tx, rx) = oneshot::channel();
    tokio::spawn(driver::run_flow(
        shared.clone(),
        route.clone(),
        admitted,
        upstream,
        tx,
    ));
    match rx.await {
        Ok(r) => r,
        Err(_) => to_hyper(idempo_core::machine::problem::problem_response(
            idempo_core::machine::problem::ProblemKind::StoreUnavailable,
            None,
            None,
            Some(route.config.unavailable_retry_after_ms.get()),
        )),
    }
}

/// The request to the upstream: the same method, path and query under the upstream's base
/// URL, the end-to-end headers, and `body`.
fn upstream_request(
    base: &Uri,
    parts: &hyper::http::request::Parts,
    body: BoxBody,
) -> Result<Request<BoxBody>, String> {
    let prefix = base.path().trim_end_matches('/');
    let pq = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |pq| pq.as_str());
    let uri: Uri = Uri::builder()
        .scheme(base.scheme_str().unwrap_or("http"))
        .authority(base.authority().map_or("", |a| a.as_str()))
        .path_and_query(format!("{prefix}{pq}"))
        .build()
        .map_err(|e| e.to_string())?;
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    for (n, v) in &parts.headers {
        if is_hop_by_hop(n.as_str()) || n == hyper::header::HOST {
            continue;
        }
        req.headers_mut().append(n.clone(), v.clone());
    }
    Ok(req)
}

/// A request forwarded unprotected (no key on a route where core says the key is optional, or
/// a request that matches no route, to the fallback upstream): answered as is, streaming both
/// ways.
async fn pass_through(shared: &Shared, base: &Uri, req: Request<Incoming>) -> Response<BoxBody> {
    let (parts, body) = req.into_parts();
    let body = body.map_err(Into::into).boxed();
    let upstream = match upstream_request(base, &parts, body) {
        Ok(r) => r,
        Err(e) => return text(500, format!("bad upstream URI: {e}\n")),
    };
    let timeout = Duration::from_millis(shared.cfg.upstream_timeout_ms);
    match tokio::time::timeout(timeout, shared.client.request(upstream)).await {
        Ok(Ok(resp)) => {
            let mut resp = resp.map(|b| b.map_err(Into::into).boxed());
            strip_hop_by_hop(resp.headers_mut());
            resp
        }
        Ok(Err(_)) => text(502, "the upstream service failed\n"),
        Err(_) => text(504, "the upstream service did not answer in time\n"),
    }
}
