//! The upstream of `make bench-gateway` (evidence/bench/gateway/): the smallest fast HTTP/1.1
//! service that counts what it executes, so the benchmark measures the proxy, not the service.
//!
//! ```text
//! bench_upstream PORT [WORK_MS]   # 0 picks a port; prints `listening PORT` on stdout once bound
//! ```
//!
//! `WORK_MS` (default 0, fractions allowed): each `POST` waits that long before it answers (a
//! thread sleep, no CPU, to the kernel's timer precision), as a
//! service that calls its database or a payment provider does; `make bench-gateway
//! BENCH_GATEWAY_ARGS="--upstream-work-ms 1"` reads the gateway's latency beside such a service.
//!
//! `POST` any path: reads the body, counts one execution (and the distinct values of the
//! `Idempotency-Key` header it was given: the gateway's downstream key), answers 201 with a
//! small JSON body. `GET /count`: `{"handler": executions, "keys": distinct keys}`. `GET
//! /health`: 200. One thread (a current-thread tokio runtime): the harness pins it to a core.
use std::collections::HashSet;
use std::io::Write;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

#[derive(Default)]
struct Counts {
    executions: u64,
    keys: HashSet<String>,
}

fn json(status: u16, text: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

async fn serve(
    counts: Arc<Mutex<Counts>>,
    work: std::time::Duration,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    if req.method() == hyper::Method::GET {
        return Ok(match req.uri().path() {
            "/count" => {
                let c = counts
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                json(
                    200,
                    format!("{{\"handler\":{},\"keys\":{}}}", c.executions, c.keys.len()),
                )
            }
            "/health" => json(200, "{\"ok\":true}".to_owned()),
            _ => json(404, "{\"error\":\"not found\"}".to_owned()),
        });
    }
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = req.into_body().collect().await?.to_bytes();
    if !work.is_zero() {
        // A thread sleep on the blocking pool, not tokio's timer: tokio rounds every deadline up
        // to a whole millisecond, so the requests that arrived within one millisecond would all
        // wake on the same tick and reach the proxy in one burst, where each waits for the CPU
        // of every one ahead of it. A service's own work is not aligned to a clock like that.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(work)).await;
    }
    let n = {
        let mut c = counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        c.executions += 1;
        if let Some(k) = key {
            c.keys.insert(k);
        }
        c.executions
    };
    Ok(json(
        201,
        format!(
            "{{\"status\":\"succeeded\",\"id\":{n},\"received\":{}}}",
            body.len()
        ),
    ))
}

fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let work_ms: f64 = std::env::args()
        .nth(2)
        .and_then(|p| p.parse().ok())
        .filter(|ms: &f64| ms.is_finite() && *ms >= 0.0)
        .unwrap_or(0.0);
    let work = std::time::Duration::from_secs_f64(work_ms / 1000.0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let mut out = std::io::stdout();
        writeln!(out, "listening {}", listener.local_addr()?.port())?;
        out.flush()?;
        let counts: Arc<Mutex<Counts>> = Arc::default();
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            let c = counts.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| serve(c.clone(), work, req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}
