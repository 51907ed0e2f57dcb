//! Forwarding: the request the upstream gets (method, path and query under the upstream's base
//! URL, end-to-end headers), and unprotected pass-through.
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, Uri};

use crate::body::{BoxBody, is_hop_by_hop, text};
use crate::exchange::strip_hop_by_hop;
use crate::proxy::Shared;

/// The request to the upstream: the same method, path and query under the upstream's base
/// URL, the end-to-end headers, and `body`.
///
/// # Errors
/// A message when the URI cannot be built.
pub fn upstream_request(
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
pub async fn pass_through(
    shared: &Shared,
    base: &Uri,
    req: Request<Incoming>,
) -> Response<BoxBody> {
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
