//! The gateway through real sockets: the built binary in front of an upstream hyper server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Gateway, client, config, crashing_upstream, get, post, temp_dir, upstream};

const ALICE: (&str, &str) = ("X-Principal", "alice");

fn sqlite(dir: &std::path::Path) -> String {
    format!(
        "kind = \"sqlite\"\npath = \"{}\"",
        dir.join("idempo.sqlite3").display()
    )
}

#[tokio::test]
async fn a_retry_replays_and_the_upstream_runs_once() {
    let dir = temp_dir("replay");
    let (up, seen) = upstream().await;
    let gw = Gateway::start(&dir, &config(&sqlite(&dir), up, "/payments", ""));
    let c = client();
    let h = [("Idempotency-Key", "key-0000-k-replay-1"), ALICE];
    let first = post(&c, &gw.url("/payments"), &h, r#"{"amount":10}"#)
        .await
        .unwrap();
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(first.header("idempotent-replayed").is_none());
    let again = post(&c, &gw.url("/payments"), &h, r#"{ "amount" : 10 }"#)
        .await
        .unwrap();
    assert_eq!(again.status, 201);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    {
        let s = seen.lock().unwrap();
        assert_eq!(s.calls.get("/payments"), Some(&1));
        // The upstream got core's downstream key (64 hex), not the client's key.
        let key = s.keys[0].clone().unwrap();
        assert_eq!(key.len(), 64, "{key}");
        assert_ne!(key, "key-0000-k-replay-1");
    }
    let metrics = get(&c, &gw.url("/metrics")).await.text();
    assert!(
        metrics.contains("idempo_requests_total{route=\"/payments\",outcome=\"replayed\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("idempo_requests_total{route=\"/payments\",outcome=\"stored\"} 1"),
        "{metrics}"
    );
    // The SQLite store's group commit: its batch sizes (sequential requests: batches of one).
    assert!(
        metrics.contains("# TYPE idempo_gateway_sqlite_batch_size histogram"),
        "{metrics}"
    );
    assert!(
        metrics.contains("idempo_gateway_sqlite_batch_size_bucket{le=\"1\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_same_key_with_another_body_is_422_and_principals_are_separate() {
    let dir = temp_dir("mismatch");
    let (up, seen) = upstream().await;
    let gw = Gateway::start(&dir, &config("kind = \"memory\"", up, "/payments", ""));
    let c = client();
    let h = [("Idempotency-Key", "key-0000-k-mm"), ALICE];
    assert_eq!(
        post(&c, &gw.url("/payments"), &h, r#"{"amount":10}"#)
            .await
            .unwrap()
            .status,
        201
    );
    let other = post(&c, &gw.url("/payments"), &h, r#"{"amount":11}"#)
        .await
        .unwrap();
    assert_eq!(other.status, 422, "{}", other.text());
    assert_eq!(other.problem_type(), "urn:idempo:problem:key-reused");
    // Bob's key of the same text is his own record.
    let bob = [("Idempotency-Key", "key-0000-k-mm"), ("X-Principal", "bob")];
    let b = post(&c, &gw.url("/payments"), &bob, r#"{"amount":11}"#)
        .await
        .unwrap();
    assert_eq!(b.status, 201);
    assert!(b.header("idempotent-replayed").is_none());
    assert_eq!(seen.lock().unwrap().calls.get("/payments"), Some(&2));
}

#[tokio::test]
async fn refusals_forward_nothing() {
    let dir = temp_dir("refuse");
    let (up, seen) = upstream().await;
    let gw = Gateway::start(
        &dir,
        &config(
            "kind = \"memory\"",
            up,
            "/payments",
            "max_request_body_bytes = 64",
        ),
    );
    let c = client();
    let url = gw.url("/payments");
    let no_principal = post(&c, &url, &[("Idempotency-Key", "key-0000-k1")], "{}")
        .await
        .unwrap();
    assert_eq!(no_principal.status, 500, "{}", no_principal.text());
    assert_eq!(
        no_principal.problem_type(),
        "urn:idempo:problem:scope-unresolved"
    );
    // Two principal fields (one injected by the client): refused, never guessed.
    let mut req = hyper::Request::post(&url)
        .header("content-type", "application/json")
        .header("Idempotency-Key", "key-0000-k-two")
        .header("X-Principal", "alice")
        .header("X-Principal", "mallory")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    req.headers_mut()
        .append("x-principal", "bob".parse().unwrap());
    let two = c.request(req).await.unwrap();
    assert_eq!(two.status(), 500);
    let no_key = post(&c, &url, &[ALICE], "{}").await.unwrap();
    assert_eq!(no_key.status, 400);
    assert_eq!(no_key.problem_type(), "urn:idempo:problem:missing-key");
    let bad_key = post(&c, &url, &[("Idempotency-Key", ""), ALICE], "{}")
        .await
        .unwrap();
    assert_eq!(bad_key.status, 400);
    let big = "x".repeat(100);
    let too_big = post(
        &c,
        &url,
        &[("Idempotency-Key", "key-0000-k2"), ALICE],
        &format!("{{\"a\":\"{big}\"}}"),
    )
    .await
    .unwrap();
    assert_eq!(too_big.status, 413);
    let bad_json = post(
        &c,
        &url,
        &[("Idempotency-Key", "key-0000-k3"), ALICE],
        "{\"a\":",
    )
    .await
    .unwrap();
    assert_eq!(bad_json.status, 400);
    assert_eq!(bad_json.problem_type(), "urn:idempo:problem:invalid-body");
    assert!(seen.lock().unwrap().calls.is_empty(), "nothing forwarded");
}

#[tokio::test]
async fn a_concurrent_duplicate_is_409_with_retry_after_then_replays() {
    let dir = temp_dir("inflight");
    let (up, seen) = upstream().await;
    let gw = Gateway::start(&dir, &config(&sqlite(&dir), up, "/slow", ""));
    let c = client();
    let url = gw.url("/slow?ms=1500");
    let h = [("Idempotency-Key", "key-0000-k-dup"), ALICE];
    let first = {
        let c = c.clone();
        let url = url.clone();
        tokio::spawn(async move { post(&c, &url, &h, r#"{"amount":1}"#).await })
    };
    while !seen.lock().unwrap().calls.contains_key("/slow") {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let dup = post(&c, &url, &h, r#"{"amount":1}"#).await.unwrap();
    assert_eq!(dup.status, 409, "{}", dup.text());
    assert_eq!(dup.problem_type(), "urn:idempo:problem:in-flight");
    let retry_after: u64 = dup.header("retry-after").unwrap().parse().unwrap();
    assert!(retry_after >= 1);
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status, 201);
    let replay = post(&c, &url, &h, r#"{"amount":1}"#).await.unwrap();
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.body, first.body);
    assert_eq!(seen.lock().unwrap().calls.get("/slow"), Some(&1));
}

#[tokio::test]
async fn an_upstream_that_drops_the_connection_is_502_then_outcome_unknown() {
    let dir = temp_dir("crash");
    let (up, calls) = crashing_upstream().await;
    let gw = Gateway::start(&dir, &config(&sqlite(&dir), up, "/payments", ""));
    let c = client();
    let h = [("Idempotency-Key", "key-0000-k-crash"), ALICE];
    let first = post(&c, &gw.url("/payments"), &h, "{}").await.unwrap();
    assert_eq!(first.status, 502, "{}", first.text());
    // Core's default takeover policy settles the key as outcome-unknown: no second run.
    let retry = post(&c, &gw.url("/payments"), &h, "{}").await.unwrap();
    assert_eq!(retry.status, 500, "{}", retry.text());
    assert_eq!(retry.problem_type(), "urn:idempo:problem:outcome-unknown");
    assert_eq!(*calls.lock().unwrap(), 1);
}

#[tokio::test]
async fn an_unreachable_upstream_releases_the_key() {
    let dir = temp_dir("unreachable");
    // A port nobody listens on.
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = probe.local_addr().unwrap();
    drop(probe);
    let gw = Gateway::start(&dir, &config("kind = \"memory\"", dead, "/payments", ""));
    let c = client();
    let h = [("Idempotency-Key", "key-0000-k-dead"), ALICE];
    let a = post(&c, &gw.url("/payments"), &h, "{}").await.unwrap();
    assert_eq!(a.status, 502);
    // Nothing reached the upstream, so core released the key: the retry runs again (502 again,
    // not outcome-unknown).
    let b = post(&c, &gw.url("/payments"), &h, "{}").await.unwrap();
    assert_eq!(b.status, 502, "{}", b.text());
}

#[tokio::test]
async fn an_upstream_timeout_is_504_then_outcome_unknown() {
    let dir = temp_dir("timeout");
    let (up, seen) = upstream().await;
    let cfg = config(&sqlite(&dir), up, "/slow", "")
        .replace("upstream_timeout_ms = 5000", "upstream_timeout_ms = 300");
    let gw = Gateway::start(&dir, &cfg);
    let c = client();
    let h = [("Idempotency-Key", "key-0000-k-to"), ALICE];
    let started = std::time::Instant::now();
    let a = post(&c, &gw.url("/slow?ms=3000"), &h, "{}").await.unwrap();
    assert_eq!(a.status, 504, "{}", a.text());
    assert!(started.elapsed() < Duration::from_millis(2500));
    let b = post(&c, &gw.url("/slow?ms=3000"), &h, "{}").await.unwrap();
    assert_eq!(b.problem_type(), "urn:idempo:problem:outcome-unknown");
    assert_eq!(seen.lock().unwrap().calls.get("/slow"), Some(&1));
}

#[tokio::test]
async fn a_50_mib_response_streams_within_bounded_memory() {
    let dir = temp_dir("big");
    let (up, seen) = upstream().await;
    let gw = Gateway::start(&dir, &config(&sqlite(&dir), up, "/big", ""));
    let c = client();
    let h = [("Idempotency-Key", "key-0000-k-big"), ALICE];
    let before = gw.peak_rss_kib();
    let mut req = hyper::Request::post(gw.url("/big?mb=50"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    for (n, v) in h {
        req.headers_mut().insert(n, v.parse().unwrap());
    }
    let resp = c.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut total = 0usize;
    use http_body_util::BodyExt;
    while let Some(frame) = body.frame().await {
        if let Ok(d) = frame.unwrap().into_data() {
            total += d.len();
        }
    }
    assert_eq!(total, 50 << 20);
    let peak = gw.peak_rss_kib();
    eprintln!("gateway peak RSS: {before} KiB at start, {peak} KiB after 50 MiB");
    assert!(
        peak < before + 16 * 1024,
        "peak RSS {peak} KiB vs {before} KiB before: the body was held in memory"
    );
    // Too large to keep (core's 1 MiB default): retries replay response-not-retained.
    let retry = common::post(&c, &gw.url("/big?mb=50"), &h, "{}")
        .await
        .unwrap();
    assert_eq!(retry.status, 500);
    assert_eq!(
        retry.problem_type(),
        "urn:idempo:problem:response-not-retained"
    );
    assert_eq!(seen.lock().unwrap().calls.get("/big"), Some(&1));
}

#[tokio::test]
async fn kill_9_mid_request_then_restart_on_the_same_file_runs_once_downstream() {
    let dir = temp_dir("kill9");
    let (up, seen) = upstream().await;
    let cfg = config(
        &sqlite(&dir),
        up,
        "/slow",
        "lease_ms = 1000\nttl_ms = 60000\ntakeover = \"re_run\"",
    );
    let mut gw = Gateway::start(&dir, &cfg);
    let c = client();
    let h = [("Idempotency-Key", "key-0000-k-kill"), ALICE];
    let url = gw.url("/slow?ms=4000");
    let pending = {
        let c = c.clone();
        tokio::spawn(async move { post(&c, &url, &h, r#"{"amount":5}"#).await })
    };
    while !seen.lock().unwrap().calls.contains_key("/slow") {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gw.kill9();
    assert!(
        pending.await.unwrap().is_err(),
        "the client lost its answer"
    );
    let gw2 = Gateway::start(&dir, &cfg);
    let url = gw2.url("/slow?ms=4000");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let answer = loop {
        let a = post(&c, &url, &h, r#"{"amount":5}"#).await.unwrap();
        if a.status != 409 || std::time::Instant::now() > deadline {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(answer.status, 201, "{}", answer.text());
    {
        let s = seen.lock().unwrap();
        assert_eq!(s.calls.get("/slow"), Some(&2), "taken over once");
        assert_eq!(s.keys.len(), 2);
        assert!(s.keys[0].is_some());
        assert_eq!(s.keys[0], s.keys[1], "the same downstream key both times");
        assert_eq!(s.effects.len(), 1, "the upstream deduplicated on it");
    }
    // The upstream's deduplicated answer says so; and now the key replays.
    assert!(
        answer.text().contains("\"first\":false"),
        "{}",
        answer.text()
    );
    let replay = post(&c, &url, &h, r#"{"amount":5}"#).await.unwrap();
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(seen.lock().unwrap().calls.get("/slow"), Some(&2));
    let metrics = get(&c, &gw2.url("/metrics")).await.text();
    assert!(
        metrics.contains("idempo_takeovers_total{route=\"/slow\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn health_readiness_and_graceful_shutdown() {
    let dir = temp_dir("ops");
    let (up, seen) = upstream().await;
    let mut gw = Gateway::start(&dir, &config(&sqlite(&dir), up, "/slow", ""));
    let c = client();
    assert_eq!(get(&c, &gw.url("/healthz")).await.status, 200);
    assert_eq!(get(&c, &gw.url("/readyz")).await.status, 200);
    let url = gw.url("/slow?ms=800");
    let pending = {
        let c = c.clone();
        tokio::spawn(async move {
            post(
                &c,
                &url,
                &[("Idempotency-Key", "key-0000-k-term"), ALICE],
                "{}",
            )
            .await
        })
    };
    while !seen.lock().unwrap().calls.contains_key("/slow") {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = tokio::task::spawn_blocking(move || {
        let s = gw.terminate(Duration::from_secs(5));
        (s, gw)
    })
    .await
    .unwrap();
    let answer = pending.await.unwrap().unwrap();
    assert_eq!(answer.status, 201, "the in-flight request finished");
    assert!(status.0.is_some_and(|s| s.success()), "{:?}", status.0);
}

#[test]
fn check_config_names_the_line() {
    let dir = temp_dir("check");
    let file = dir.join("bad.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:0\"\n\n[store]\nkind = \"redis\"\n\n[upstreams]\na = \"http://127.0.0.1:1\"\n\n[[routes]]\nmethod = \"POST\"\npath = \"/p\"\nupstream = \"a\"\npublic = true\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idempo-gateway"))
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml:4:8:"), "{err}");
    assert!(err.contains("the redis store needs url"), "{err}");
    let good = std::fs::read_to_string(&file)
        .unwrap()
        .replace("redis", "memory");
    std::fs::write(&file, good).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idempo-gateway"))
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "OK\n");
}

#[tokio::test]
async fn unprotected_traffic_passes_through() {
    let dir = temp_dir("fallback");
    let (up, seen) = upstream().await;
    let cfg = config("kind = \"memory\"", up, "/payments", "key_required = false")
        .replace("[store]", "fallback_upstream = \"app\"\n\n[store]");
    let gw = Gateway::start(&dir, &cfg);
    let c = client();
    // No route: forwarded to the fallback upstream, no key involved.
    let other = get(&c, &gw.url("/accounts/1")).await;
    assert_eq!(other.status, 201);
    // The key is optional on this route: without one core lets the request through unprotected.
    let a = post(&c, &gw.url("/payments"), &[ALICE], "{}")
        .await
        .unwrap();
    let b = post(&c, &gw.url("/payments"), &[ALICE], "{}")
        .await
        .unwrap();
    assert_eq!((a.status, b.status), (201, 201));
    assert!(b.header("idempotent-replayed").is_none());
    let s = seen.lock().unwrap();
    assert_eq!(s.calls.get("/payments"), Some(&2));
    assert_eq!(s.calls.get("/accounts/1"), Some(&1));
    assert!(
        s.keys.iter().all(Option::is_none),
        "no downstream key: {:?}",
        s.keys
    );
}

#[tokio::test]
async fn the_purge_task_deletes_expired_records() {
    let dir = temp_dir("purge");
    let (up, _seen) = upstream().await;
    let cfg = config(
        &sqlite(&dir),
        up,
        "/payments",
        "lease_ms = 1000\nttl_ms = 1200",
    )
    .replace("[store]", "purge_interval_ms = 200\n\n[store]");
    let gw = Gateway::start(&dir, &cfg);
    let c = client();
    let h = [("Idempotency-Key", "key-0000-k-purge"), ALICE];
    assert_eq!(
        post(&c, &gw.url("/payments"), &h, "{}")
            .await
            .unwrap()
            .status,
        201
    );
    let rows = || {
        let conn = rusqlite::Connection::open(dir.join("idempo.sqlite3")).unwrap();
        conn.query_row("SELECT count(*) FROM idempo_record", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap()
    };
    assert_eq!(rows(), 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while rows() != 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(rows(), 0, "the expired record was purged");
    let logs = gw.logs.lock().unwrap().join("\n");
    assert!(logs.contains("purged expired records"), "{logs}");
}

#[tokio::test]
async fn the_heartbeat_keeps_a_slow_upstream_s_lease() {
    let dir = temp_dir("heartbeat");
    let (up, seen) = upstream().await;
    // A 1 s lease, renewed every third of it, and an upstream that takes 2.5 s.
    let cfg = config(
        &sqlite(&dir),
        up,
        "/slow",
        "lease_ms = 1000\ntakeover = \"re_run\"",
    );
    let gw = Gateway::start(&dir, &cfg);
    let c = client();
    let url = gw.url("/slow?ms=2500");
    let h = [("Idempotency-Key", "key-0000-k-hb"), ALICE];
    let first = {
        let c = c.clone();
        let url = url.clone();
        tokio::spawn(async move { post(&c, &url, &h, "{}").await })
    };
    while !seen.lock().unwrap().calls.contains_key("/slow") {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Well past the first lease: without renewals this duplicate would take the key over.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let dup = post(&c, &url, &h, "{}").await.unwrap();
    assert_eq!(dup.status, 409, "{}", dup.text());
    assert_eq!(first.await.unwrap().unwrap().status, 201);
    assert_eq!(seen.lock().unwrap().calls.get("/slow"), Some(&1));
}

#[tokio::test]
async fn a_locked_store_fails_closed_with_503() {
    let dir = temp_dir("locked");
    let (up, seen) = upstream().await;
    let store = format!("{}\nbusy_timeout_ms = 200", sqlite(&dir));
    let gw = Gateway::start(&dir, &config(&store, up, "/payments", ""));
    let c = client();
    let conn = rusqlite::Connection::open(dir.join("idempo.sqlite3")).unwrap();
    conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let h = [("Idempotency-Key", "key-0000-k-locked"), ALICE];
    let a = post(&c, &gw.url("/payments"), &h, "{}").await.unwrap();
    assert_eq!(a.status, 503, "{}", a.text());
    assert_eq!(a.problem_type(), "urn:idempo:problem:store-unavailable");
    assert!(a.header("retry-after").is_some());
    assert!(seen.lock().unwrap().calls.is_empty(), "nothing forwarded");
    conn.execute_batch("COMMIT").unwrap();
    let b = post(&c, &gw.url("/payments"), &h, "{}").await.unwrap();
    assert_eq!(b.status, 201, "{}", b.text());
    let metrics = get(&c, &gw.url("/metrics")).await.text();
    assert!(
        metrics.contains("idempo_store_errors_total{route=\"/payments\",op=\"claim\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_upstream_that_dies_mid_body_aborts_the_client_then_outcome_unknown() {
    let dir = temp_dir("midbody");
    let (up, calls) = common::crashing_upstream_with(true).await;
    let gw = Gateway::start(&dir, &config(&sqlite(&dir), up, "/payments", ""));
    let c = client();
    let h = [("Idempotency-Key", "key-0000-k-midbody"), ALICE];
    // The head was streamed (201), then the body broke: the client's read fails.
    let first = post(&c, &gw.url("/payments"), &h, "{}").await;
    assert!(first.is_err(), "{first:?}");
    let retry = post(&c, &gw.url("/payments"), &h, "{}").await.unwrap();
    assert_eq!(retry.status, 500, "{}", retry.text());
    assert_eq!(retry.problem_type(), "urn:idempo:problem:outcome-unknown");
    assert_eq!(*calls.lock().unwrap(), 1);
}

#[tokio::test]
async fn two_gateways_share_one_sqlite_file() {
    let dir = temp_dir("shared");
    let (up, seen) = upstream().await;
    let cfg = config(&sqlite(&dir), up, "/payments", "");
    let a_dir = dir.join("a");
    let b_dir = dir.join("b");
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    let a = Gateway::start(&a_dir, &cfg);
    let b = Gateway::start(&b_dir, &cfg);
    let c = client();
    let h = [("Idempotency-Key", "key-0000-k-shared"), ALICE];
    let first = post(&c, &a.url("/payments"), &h, r#"{"amount":3}"#)
        .await
        .unwrap();
    assert_eq!(first.status, 201);
    let other = post(&c, &b.url("/payments"), &h, r#"{"amount":3}"#)
        .await
        .unwrap();
    assert_eq!(other.header("idempotent-replayed"), Some("true"));
    assert_eq!(other.body, first.body);
    assert_eq!(seen.lock().unwrap().calls.get("/payments"), Some(&1));
}

#[tokio::test]
async fn a_status_core_does_not_store_passes_through_and_releases_the_key() {
    let dir = temp_dir("notstored");
    let (up, seen) = upstream().await;
    let gw = Gateway::start(&dir, &config(&sqlite(&dir), up, "/fail", ""));
    let c = client();
    let h = [("Idempotency-Key", "key-0000-k-fail"), ALICE];
    for _ in 0..2 {
        let a = post(&c, &gw.url("/fail"), &h, "{}").await.unwrap();
        assert_eq!(a.status, 500);
        assert_eq!(a.text(), "{\"error\":\"boom\"}");
        assert!(a.header("idempotent-replayed").is_none());
    }
    // 5xx is not stored by default: the key was released and the retry ran again.
    assert_eq!(seen.lock().unwrap().calls.get("/fail"), Some(&2));
    // A passed-through answer reaches the client while the flow releases the key: the count
    // follows within moments.
    let want = "idempo_requests_total{route=\"/fail\",outcome=\"not_stored\"} 2";
    let mut metrics = String::new();
    for _ in 0..50 {
        metrics = get(&c, &gw.url("/metrics")).await.text();
        if metrics.contains(want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(metrics.contains(want), "{metrics}");
    // With store_server_errors the same answer is kept and replayed.
    let dir = temp_dir("stored500");
    let gw = Gateway::start(
        &dir,
        &config(&sqlite(&dir), up, "/fail", "store_server_errors = true"),
    );
    let h = [("Idempotency-Key", "key-0000-k-fail2"), ALICE];
    let _ = post(&c, &gw.url("/fail"), &h, "{}").await.unwrap();
    let b = post(&c, &gw.url("/fail"), &h, "{}").await.unwrap();
    assert_eq!(b.status, 500);
    assert_eq!(b.header("idempotent-replayed"), Some("true"));
    assert_eq!(seen.lock().unwrap().calls.get("/fail"), Some(&3));
}

#[tokio::test]
async fn a_streamed_answer_ends_only_once_recorded_so_an_immediate_retry_replays() {
    let dir = temp_dir("hold");
    let (up, seen) = upstream().await;
    let gw = Gateway::start(&dir, &config(&sqlite(&dir), up, "/big", ""));
    let c = client();
    let h = [("Idempotency-Key", "key-0000-k-hold"), ALICE];
    let url = gw.url("/big?kb=8&ms=300");
    let first = {
        let c = c.clone();
        let url = url.clone();
        tokio::spawn(async move { post(&c, &url, &h, "{}").await })
    };
    while !seen.lock().unwrap().calls.contains_key("/big") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The key is claimed; hold the file's write lock while the chunked answer streams, so the
    // completion waits.
    let conn = rusqlite::Connection::open(dir.join("idempo.sqlite3")).unwrap();
    conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        !first.is_finished(),
        "the client had the whole answer before its record was written"
    );
    conn.execute_batch("COMMIT").unwrap();
    let a = first.await.unwrap().unwrap();
    assert_eq!((a.status, a.body.len()), (200, 8 << 10));
    let b = post(&c, &url, &h, "{}").await.unwrap();
    assert_eq!(
        b.header("idempotent-replayed"),
        Some("true"),
        "{}",
        b.text()
    );
    assert_eq!(b.body, a.body);
    assert_eq!(seen.lock().unwrap().calls.get("/big"), Some(&1));
}

#[tokio::test]
async fn shutdown_stops_waiting_at_its_deadline() {
    let dir = temp_dir("deadline");
    let (up, seen) = upstream().await;
    let cfg = config(&sqlite(&dir), up, "/slow", "")
        .replace("shutdown_deadline_ms = 5000", "shutdown_deadline_ms = 300");
    let mut gw = Gateway::start(&dir, &cfg);
    let c = client();
    let url = gw.url("/slow?ms=5000");
    let pending = {
        let c = c.clone();
        tokio::spawn(async move {
            post(
                &c,
                &url,
                &[("Idempotency-Key", "key-0000-k-deadline"), ALICE],
                "{}",
            )
            .await
        })
    };
    while !seen.lock().unwrap().calls.contains_key("/slow") {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = std::time::Instant::now();
    let (status, gw) = tokio::task::spawn_blocking(move || {
        let s = gw.terminate(Duration::from_secs(4));
        (s, gw)
    })
    .await
    .unwrap();
    assert!(status.is_some(), "the gateway exited");
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    assert!(
        pending.await.unwrap().is_err(),
        "the request was cut at the deadline"
    );
    let logs = gw.logs.lock().unwrap().join("\n");
    assert!(logs.contains("shutdown deadline passed"), "{logs}");
}

#[tokio::test]
async fn a_client_that_goes_away_mid_flow_still_gets_its_record_settled() {
    let dir = temp_dir("client-gone");
    let (up, seen) = upstream().await;
    let gw = Gateway::start(&dir, &config(&sqlite(&dir), up, "/slow", ""));
    let c = client();
    let url = gw.url("/slow?ms=500");
    let h = [("Idempotency-Key", "key-0000-k-gone"), ALICE];
    // The client gives up while the upstream runs: the flow goes on without it.
    let gave_up = tokio::time::timeout(Duration::from_millis(150), post(&c, &url, &h, "{}")).await;
    assert!(
        gave_up.is_err(),
        "the first request should still be running"
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    let again = post(&client(), &url, &h, "{}").await.unwrap();
    assert_eq!(again.status, 201, "{}", again.text());
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(seen.lock().unwrap().calls.get("/slow"), Some(&1));
}

/// One raw HTTP/1.1 request (for what a client library would not send, such as a lower-case
/// method); the status code of the answer.
async fn raw_status(gw: &Gateway, head: &str, body: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let req = format!(
        "{head}\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    text.split(' ').nth(1).unwrap_or("0").parse().unwrap_or(0)
}

// A variant of a protected path (a trailing slash, another letter case, a doubled slash, `;`
// parameters, percent-encoded letters) is protected as its route, never forwarded unprotected to
// the fallback upstream, whose own router may well run the same handler for it.
#[tokio::test]
async fn variants_of_a_protected_path_are_protected_not_passed_through() {
    let dir = temp_dir("variants");
    let (up, seen) = upstream().await;
    let cfg = config("kind = \"memory\"", up, "/payments", "")
        .replace("[store]", "fallback_upstream = \"app\"\n\n[store]");
    let gw = Gateway::start(&dir, &cfg);
    let c = client();
    let body = r#"{"amount":10}"#;
    let calls = || seen.lock().unwrap().calls.values().sum::<u64>();
    for (i, path) in [
        "/payments/",
        "/PAYMENTS",
        "//payments",
        "/payments;v=1",
        "/p%61yments",
        "/x/../payments",
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("key-0000-variant-{i}");
        let h = [("Idempotency-Key", key.as_str()), ALICE];
        let before = calls();
        let first = post(&c, &gw.url(path), &h, body).await.unwrap();
        assert_eq!(first.status, 201, "{path}: {}", first.text());
        let again = post(&c, &gw.url(path), &h, body).await.unwrap();
        assert_eq!(again.status, 201, "{path}: {}", again.text());
        assert_eq!(again.header("idempotent-replayed"), Some("true"), "{path}");
        assert_eq!(calls(), before + 1, "{path}: the upstream ran once");
        // Without a key the route's rule applies (key required: 400), not the fallback.
        let nokey = post(&c, &gw.url(path), &[ALICE], body).await.unwrap();
        assert_eq!(nokey.status, 400, "{path}: {}", nokey.text());
        assert_eq!(
            calls(),
            before + 1,
            "{path}: nothing forwarded without a key"
        );
    }
    // The same key on another variant of the target is another request: 422, not a second run.
    let h = [("Idempotency-Key", "key-0000-variant-0"), ALICE];
    let other = post(&c, &gw.url("/payments"), &h, body).await.unwrap();
    assert_eq!(other.status, 422, "{}", other.text());
    // A lower-case method is the route's too (core's scope upper-cases it).
    let before = calls();
    let head =
        "post /payments HTTP/1.1\r\nIdempotency-Key: key-0000-variant-lower\r\nX-Principal: alice";
    assert_eq!(raw_status(&gw, head, body).await, 201);
    assert_eq!(raw_status(&gw, head, body).await, 201);
    assert_eq!(calls(), before + 1, "a lower-case method ran once");
    // Paths that are not variants still pass through.
    let refunds = post(&c, &gw.url("/payments/refunds"), &[ALICE], body)
        .await
        .unwrap();
    assert_eq!(refunds.status, 201);
    assert_eq!(
        seen.lock().unwrap().calls.get("/payments/refunds"),
        Some(&1)
    );
}

// With operations_listen, /healthz, /readyz and /metrics are answered there only: on the main
// listener they are paths like any other (here forwarded to the fallback upstream), so the
// metrics need not face the clients.
#[tokio::test]
async fn operations_endpoints_on_an_address_of_their_own() {
    let dir = temp_dir("operations");
    let (up, seen) = upstream().await;
    let cfg = config("kind = \"memory\"", up, "/payments", "").replace(
        "[store]",
        "fallback_upstream = \"app\"\noperations_listen = \"127.0.0.1:0\"\n\n[store]",
    );
    let gw = Gateway::start(&dir, &cfg);
    let ops: std::net::SocketAddr = gw
        .logs
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["msg"] == "operations listening")
        .and_then(|v| v["addr"].as_str().map(str::to_owned))
        .expect("the operations address is logged before listening")
        .parse()
        .unwrap();
    let c = client();
    let h = [("Idempotency-Key", "key-0000-ops-1"), ALICE];
    let paid = post(&c, &gw.url("/payments"), &h, "{}").await.unwrap();
    assert_eq!(paid.status, 201, "{}", paid.text());

    let at = |path: &str| format!("http://{ops}{path}");
    assert_eq!(get(&c, &at("/healthz")).await.text(), "ok\n");
    assert_eq!(get(&c, &at("/readyz")).await.status, 200);
    let metrics = get(&c, &at("/metrics")).await;
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .text()
            .contains("idempo_requests_total{route=\"/payments\",outcome=\"stored\"} 1"),
        "{}",
        metrics.text()
    );
    assert_eq!(get(&c, &at("/payments")).await.status, 404);

    // On the main listener the same paths belong to the upstream.
    for path in ["/metrics", "/healthz", "/readyz"] {
        let r = get(&c, &gw.url(path)).await;
        assert_eq!(r.status, 201, "{path}: {}", r.text());
        assert!(!r.text().contains("idempo_requests_total"), "{path}");
    }
    let s = seen.lock().unwrap();
    assert_eq!(s.calls.get("/metrics"), Some(&1));
    assert_eq!(s.calls.get("/healthz"), Some(&1));
}
