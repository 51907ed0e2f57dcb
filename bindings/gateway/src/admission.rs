//! Core's admission for a request on a protected route, in the order of `spec/PROTOCOL.md`
//! §7.2: the key (core's [`admit()`]), the body read within core's limit and fingerprinted by core,
//! the scope from the principal header or the verified JWT claim ([`crate::jwt`]); a refusal is core's problem response and nothing is
//! forwarded. An admitted request goes to the [`driver`](mod@crate::driver).
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use idempo_core::fingerprint::RequestParts;
use idempo_core::machine::{
    BodyRead, BodyStage, KeyStage, Refusal, ScopeResolution, ScopeRule, ScopeStage, admit,
};
use serde_json::json;
use tokio::sync::oneshot;

use crate::body::{BoxBody, full, text, to_hyper};
use crate::config::{PrincipalSource, RouteConfig};
use crate::forward::{pass_through, upstream_request};
use crate::jwt::{Claim, TokenError, unauthorized};
use crate::proxy::Shared;
use crate::{driver, log};

/// A request whose bearer token does not verify: the principal does not resolve, so it is
/// refused (counted under core's `scope_unresolved` outcome) with an authentication challenge,
/// and nothing is forwarded.
fn unauthenticated(shared: &Shared, route: &RouteConfig, e: &TokenError) -> Response<BoxBody> {
    let outcome = "scope_unresolved";
    shared.metrics.request(route.template.as_str(), outcome);
    log::info(
        "request",
        &[
            ("route", json!(route.template.as_str())),
            ("outcome", json!(outcome)),
            ("status", json!(e.status())),
            ("token", json!(e.to_string())),
        ],
    );
    unauthorized(e)
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

/// Admits (or refuses) one request on `route`, then runs its flow and returns its response.
pub async fn protected(
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
    // A body in one frame (the usual small JSON body) is kept as that frame, never copied.
    let mut first: Option<Bytes> = None;
    let mut buf: Vec<u8> = Vec::new();
    let mut held: usize = 0;
    let mut read: u64 = 0;
    let mut over = false;
    let mut broken = false;
    loop {
        match tokio::time::timeout(timeout, body.frame()).await {
            Ok(None) => break,
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    read = read.saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
                    if held.saturating_add(data.len()) > limit {
                        over = true;
                        break;
                    }
                    held += data.len();
                    if held == data.len() && first.is_none() {
                        first = Some(data);
                    } else {
                        if let Some(f) = first.take() {
                            buf.extend_from_slice(&f);
                        }
                        buf.extend_from_slice(&data);
                    }
                }
            }
            Ok(Some(Err(_))) | Err(_) => {
                broken = true;
                break;
            }
        }
    }
    let body_bytes = first.unwrap_or_else(|| Bytes::from(buf));
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
            body: &body_bytes,
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
    let resolution = match (route.scope_rule, &shared.cfg.principal) {
        (ScopeRule::Function { .. }, Some(PrincipalSource::Jwt(verifier))) => {
            let claim = verifier.settings().claim.as_str();
            match verifier.verify(&parts.headers) {
                Ok(Claim::Principal(p)) => {
                    principal_value = p;
                    ScopeResolution::Principal(&principal_value)
                }
                Ok(Claim::Absent) => {
                    principal_value = format!("a verified token without a {claim} claim");
                    ScopeResolution::Nothing(&principal_value)
                }
                Ok(Claim::NotAString(t)) => {
                    principal_value = format!("the token's {claim} claim is {t}");
                    ScopeResolution::NotAString(&principal_value)
                }
                Err(e) => return unauthenticated(&shared, &route, &e),
            }
        }
        (ScopeRule::Function { .. }, Some(PrincipalSource::Header(h))) => {
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
    let upstream = match upstream_request(&route.upstream_base, &parts, full(body_bytes)) {
        Ok(r) => r,
        Err(e) => {
            log::error("bad upstream URI", &[("error", json!(e))]);
            return text(500, "bad upstream URI\n");
        }
    };
    let (tx, mut rx) = oneshot::channel();
    // The flow runs on this request's task until its response is known (usually its end too);
    // if it must go on past that (a streamed body, the record still to settle) or the client
    // goes away first, the rest of it moves to a task of its own: it always runs to its end.
    let mut flow = RunToEnd(Some(Box::pin(driver::run_flow(
        shared.clone(),
        route.clone(),
        admitted,
        upstream,
        tx,
    ))));
    let answer = std::future::poll_fn(|cx| {
        if flow.poll_inner(cx).is_ready() {
            return Poll::Ready(rx.try_recv().ok());
        }
        match Pin::new(&mut rx).poll(cx) {
            Poll::Ready(r) => Poll::Ready(r.ok()),
            Poll::Pending => Poll::Pending,
        }
    })
    .await;
    drop(flow);
    match answer {
        Some(r) => r,
        None => to_hyper(idempo_core::machine::problem::problem_response(
            idempo_core::machine::problem::ProblemKind::StoreUnavailable,
            None,
            None,
            Some(route.config.unavailable_retry_after_ms.get()),
        )),
    }
}

/// A flow that runs to its end: polled in place, and spawned onto the runtime if it is dropped
/// unfinished (the response went out first, or the client went away).
struct RunToEnd(Option<Pin<Box<dyn Future<Output = ()> + Send>>>);

impl RunToEnd {
    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self.0.as_mut() {
            Some(f) => match f.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.0 = None;
                    Poll::Ready(())
                }
                Poll::Pending => Poll::Pending,
            },
            None => Poll::Ready(()),
        }
    }
}

impl Drop for RunToEnd {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(f);
            }
        }
    }
}
