//! Forwarding: the request the upstream gets (method, path and query under the upstream's base
//! URL, end-to-end headers), and unprotected pass-through.
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, Uri};

use crate::body::{BoxBody, connection_nominated, is_hop_by_hop, text};
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
    // HTTP/2 requests carry the authority in the URI (`:authority`), HTTP/1.1 in `Host`: neither
    // is forwarded, the upstream client sets the upstream's own.
    let nominated = connection_nominated(&parts.headers);
    for (n, v) in &parts.headers {
        if is_hop_by_hop(n.as_str())
            || n == hyper::header::HOST
            || nominated.iter().any(|t| t == n.as_str())
        {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::full;

    #[test]
    fn connection_specific_fields_are_not_forwarded_either_way() {
        let mut req = Request::post("http://gw.example/payments?x=1")
            .header("host", "gw.example")
            .header("connection", "keep-alive, X-Hop")
            .header("x-hop", "1")
            .header("te", "trailers")
            .header("transfer-encoding", "chunked")
            .header("x-end", "2")
            .body(())
            .expect("request");
        req.headers_mut()
            .append("connection", "x-other".parse().expect("value"));
        req.headers_mut()
            .append("x-other", "3".parse().expect("value"));
        let (parts, ()) = req.into_parts();
        let base: Uri = "http://127.0.0.1:9000/api/".parse().expect("uri");
        let up = upstream_request(&base, &parts, full(Vec::new())).expect("built");
        assert_eq!(up.uri(), "http://127.0.0.1:9000/api/payments?x=1");
        assert_eq!(up.version(), hyper::Version::HTTP_11);
        let names: Vec<&str> = up
            .headers()
            .keys()
            .map(hyper::header::HeaderName::as_str)
            .collect();
        assert_eq!(names, vec!["x-end"]);

        let mut resp = parts.headers.clone();
        strip_hop_by_hop(&mut resp);
        let names: Vec<&str> = resp.keys().map(hyper::header::HeaderName::as_str).collect();
        assert_eq!(names, vec!["host", "x-end"]);
    }
}
