//! HTTP/2 (h2c with prior knowledge) through real sockets, next to HTTP/1.1 on the same port.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::{Answer, Gateway, client, config, post, temp_dir, upstream};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// One HTTP/2 connection to `addr` (prior knowledge: no upgrade, no TLS).
async fn h2(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

/// POSTs `body` on `send` (one stream), with these headers.
async fn h2_post(
    send: &mut SendRequest<Full<Bytes>>,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut req = hyper::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    for (n, v) in headers {
        req.headers_mut().insert(
            hyper::header::HeaderName::from_bytes(n.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    send.ready().await.unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.version(), hyper::Version::HTTP_2);
    let (parts, body) = resp.into_parts();
    // Connection-specific fields are not HTTP/2 (RFC 9113 §8.2.2).
    for name in ["connection", "transfer-encoding", "keep-alive", "upgrade"] {
        assert!(
            parts.headers.get(name).is_none(),
            "{name} in an h2 response"
        );
    }
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes().to_vec(),
    }
}

const ALICE: (&str, &str) = ("X-Principal", "alice");

#[tokio::test]
async fn h2_new_then_replay_and_http1_on_the_same_port() {
    let dir = temp_dir("h2-replay");
    let (up, seen) = upstream().await;
    let gw = Gateway::start(&dir, &config("kind = \"memory\"", up, "/payments", ""));
    let mut send = h2(gw.addr).await;
    let url = gw.url("/payments");
    let h = [("Idempotency-Key", "key-0000-h2-replay"), ALICE];
    let first = h2_post(&mut send, &url, &h, r#"{"amount":10}"#).await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(first.header("idempotent-replayed").is_none());
    let again = h2_post(&mut send, &url, &h, r#"{"amount":10}"#).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!(seen.lock().unwrap().calls.get("/payments"), Some(&1));

    // HTTP/1.1 on the same port: the same record replays, a new key runs.
    let c = client();
    let h1 = post(&c, &url, &h, r#"{"amount":10}"#).await.unwrap();
    assert_eq!(h1.status, 201);
    assert_eq!(h1.header("idempotent-replayed"), Some("true"));
    assert_eq!(h1.body, first.body);
    let other = post(
        &c,
        &url,
        &[("Idempotency-Key", "key-0000-h1-new"), ALICE],
        r#"{"amount":10}"#,
    )
    .await
    .unwrap();
    assert_eq!(other.status, 201);
    assert!(other.header("idempotent-replayed").is_none());
    assert_eq!(seen.lock().unwrap().calls.get("/payments"), Some(&2));

    // A mismatch over h2 is core's 422.
    let mm = h2_post(&mut send, &url, &h, r#"{"amount":11}"#).await;
    assert_eq!(mm.status, 422, "{}", mm.text());
    assert_eq!(mm.problem_type(), "urn:idempo:problem:key-reused");
}

#[tokio::test]
async fn two_concurrent_h2_streams_with_one_key_get_409() {
    let dir = temp_dir("h2-inflight");
    let (up, seen) = upstream().await;
    let gw = Gateway::start(&dir, &config("kind = \"memory\"", up, "/slow", ""));
    let send = h2(gw.addr).await;
    let url = gw.url("/slow?ms=1500");
    let h = [("Idempotency-Key", "key-0000-h2-inflight"), ALICE];
    let first = {
        let mut send = send.clone();
        let url = url.clone();
        tokio::spawn(async move { h2_post(&mut send, &url, &h, "{}").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The second stream on the same connection, while the first is in flight.
    let mut second_send = send.clone();
    let second = h2_post(&mut second_send, &url, &h, "{}").await;
    assert_eq!(second.status, 409, "{}", second.text());
    assert_eq!(second.problem_type(), "urn:idempo:problem:in-flight");
    assert!(second.header("retry-after").is_some());
    let first = first.await.unwrap();
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(seen.lock().unwrap().calls.get("/slow"), Some(&1));
}

#[tokio::test]
async fn graceful_shutdown_finishes_an_h2_request_in_flight() {
    let dir = temp_dir("h2-shutdown");
    let (up, seen) = upstream().await;
    let mut gw = Gateway::start(&dir, &config("kind = \"memory\"", up, "/slow", ""));
    let send = h2(gw.addr).await;
    let url = gw.url("/slow?ms=1000");
    let pending = {
        let mut send = send.clone();
        tokio::spawn(async move {
            h2_post(
                &mut send,
                &url,
                &[("Idempotency-Key", "key-0000-h2-shutdown"), ALICE],
                "{}",
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let exit = tokio::task::spawn_blocking(move || {
        let status = gw.terminate(Duration::from_secs(8));
        (status, gw)
    });
    let answer = pending.await.unwrap();
    assert_eq!(answer.status, 201, "{}", answer.text());
    let (status, _gw) = exit.await.unwrap();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert_eq!(seen.lock().unwrap().calls.get("/slow"), Some(&1));
}
