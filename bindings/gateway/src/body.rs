//! Body and header helpers shared by the proxy's parts: the boxed body type, responses built
//! from core's [`HttpResponse`], and the hop-by-hop fields a proxy never forwards.
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Response;
use idempo_core::machine::HttpResponse;

/// Errors inside a body stream.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response the gateway sends.
pub type BoxBody = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// A body stream error with this message.
#[must_use]
pub fn boxed_error(msg: &str) -> BoxError {
    Box::new(std::io::Error::other(msg.to_owned()))
}

/// A whole body.
#[must_use]
pub fn full(bytes: impl Into<Bytes>) -> BoxBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// The hop-by-hop fields (RFC 9110 §7.6.1) plus `host`, which the client sets for the upstream.
#[must_use]
pub fn is_hop_by_hop(name: &str) -> bool {
    const HOP: &[&str] = &[
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// The fields a `Connection` header of `headers` nominates as hop-by-hop (RFC 9110 §7.6.1),
/// lower case: a proxy removes them along with the fixed list of [`is_hop_by_hop`].
#[must_use]
pub fn connection_nominated(headers: &hyper::HeaderMap) -> Vec<String> {
    headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}

/// Core's response as a hyper response (an invalid header from the store is dropped, never a
/// panic; hop-by-hop fields are dropped).
#[must_use]
pub fn to_hyper(r: HttpResponse) -> Response<BoxBody> {
    let mut out = Response::new(full(r.body));
    *out.status_mut() =
        hyper::StatusCode::from_u16(r.status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = out.headers_mut();
    for (n, v) in r.headers {
        if is_hop_by_hop(&n) || n.eq_ignore_ascii_case("content-length") {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(n.as_bytes()),
            hyper::header::HeaderValue::from_str(&v),
        ) {
            headers.append(n, v);
        }
    }
    out
}

/// A plain-text response (operations endpoints, unrouted requests).
#[must_use]
pub fn text(status: u16, body: impl Into<String>) -> Response<BoxBody> {
    to_hyper(HttpResponse {
        status,
        headers: vec![(
            "content-type".to_owned(),
            "text/plain; charset=utf-8".to_owned(),
        )],
        body: body.into().into_bytes(),
    })
}
