//! The gateway on Redis and on a Redis Cluster through real sockets: the built binary in front of
//! an upstream, its store a real server.
//!
//! Needs `IDEMPO_TEST_REDIS_URL` and `IDEMPO_TEST_REDIS_CLUSTER_NODES` (`host:port,...`), as
//! `scripts/test-services.sh start DIR` writes them to DIR/env (`make test-gateway` starts the
//! servers); without them each test prints a notice and passes. Each test writes under a prefix
//! of its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::relay::Relay;
use common::{Gateway, client, config, get, post, temp_dir, upstream};

const ALICE: (&str, &str) = ("X-Principal", "alice");

fn var(name: &str) -> Option<String> {
    let v = std::env::var(name).ok();
    if v.is_none() {
        eprintln!("{name} is not set: skipping (scripts/test-services.sh start DIR writes it)");
    }
    v
}

fn prefix(tag: &str) -> String {
    format!("idempo:gwit:{tag}:{}:", std::process::id())
}

/// The `[store]` lines of a single-node Redis store.
fn node_store(url: &str, tag: &str, extra: &str) -> String {
    format!(
        "kind = \"redis\"\nurl = \"{url}\"\nprefix = \"{}\"\n{extra}",
        prefix(tag)
    )
}

/// The `[store]` lines of a Redis Cluster store seeded by `nodes` (`host:port,...`).
fn cluster_store(nodes: &str, tag: &str) -> String {
    let list: Vec<String> = nodes
        .split(',')
        .map(|n| format!("\"redis://{n}\""))
        .collect();
    format!(
        "kind = \"redis\"\ncluster_nodes = [{}]\nprefix = \"{}\"\n",
        list.join(", "),
        prefix(tag)
    )
}

/// Replay (the upstream runs once, the stored answer comes back) and mismatch (422).
async fn replay_and_mismatch(store: &str, tag: &str) {
    let dir = temp_dir(&format!("redis-{tag}"));
    let (up, seen) = upstream().await;
    let gw = Gateway::start(&dir, &config(store, up, "/payments", ""));
    let c = client();
    assert_eq!(get(&c, &gw.url("/readyz")).await.status, 200);
    let url = gw.url("/payments");
    // Keys spread over the cluster's slots.
    for i in 0..8 {
        let key = format!("key-0000-redis-{tag}-{i}");
        let h = [("Idempotency-Key", key.as_str()), ALICE];
        let first = post(&c, &url, &h, r#"{"amount":10}"#).await.unwrap();
        assert_eq!(first.status, 201, "{}", first.text());
        assert!(first.header("idempotent-replayed").is_none());
        let again = post(&c, &url, &h, r#"{ "amount" : 10 }"#).await.unwrap();
        assert_eq!(again.status, 201, "{}", again.text());
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(again.body, first.body);
        let other = post(&c, &url, &h, r#"{"amount":11}"#).await.unwrap();
        assert_eq!(other.status, 422, "{}", other.text());
        assert_eq!(other.problem_type(), "urn:idempo:problem:key-reused");
    }
    assert_eq!(seen.lock().unwrap().calls.get("/payments"), Some(&8));
}

#[tokio::test]
async fn replay_and_mismatch_on_redis() {
    let Some(url) = var("IDEMPO_TEST_REDIS_URL") else {
        return;
    };
    replay_and_mismatch(&node_store(&url, "replay", ""), "node").await;
}

#[tokio::test]
async fn replay_and_mismatch_on_a_redis_cluster() {
    let Some(nodes) = var("IDEMPO_TEST_REDIS_CLUSTER_NODES") else {
        return;
    };
    replay_and_mismatch(&cluster_store(&nodes, "replay"), "cluster").await;
}

/// `host:port` of a `redis://host:port/db` URL.
fn host_port(url: &str) -> ((String, u16), String) {
    let rest = url.strip_prefix("redis://").unwrap();
    let (addr, db) = rest.split_once('/').unwrap_or((rest, "0"));
    let (host, port) = addr.rsplit_once(':').unwrap();
    ((host.to_owned(), port.parse().unwrap()), db.to_owned())
}

// Multi-threaded: the relay must answer while `Gateway::start` blocks this thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_is_503_and_nothing_is_forwarded() {
    let Some(url) = var("IDEMPO_TEST_REDIS_URL") else {
        return;
    };
    let (target, db) = host_port(&url);
    let mut relay = Relay::start(target).await;
    let via = format!("redis://127.0.0.1:{}/{db}", relay.port);
    let dir = temp_dir("redis-down");
    let (up, seen) = upstream().await;
    let store = node_store(&via, "down", "timeout_ms = 500");
    let gw = Gateway::start(&dir, &config(&store, up, "/payments", ""));
    let c = client();
    let url = gw.url("/payments");
    let h = [("Idempotency-Key", "key-0000-redis-up"), ALICE];
    let ok = post(&c, &url, &h, "{}").await.unwrap();
    assert_eq!(ok.status, 201, "{}", ok.text());
    let calls = || seen.lock().unwrap().calls.get("/payments").copied();
    assert_eq!(calls(), Some(1));

    // The server stops answering: each primitive ends at timeout_ms, 503, nothing forwarded.
    relay.freeze();
    let h = [("Idempotency-Key", "key-0000-redis-frozen"), ALICE];
    let started = Instant::now();
    let frozen = post(&c, &url, &h, "{}").await.unwrap();
    assert_eq!(frozen.status, 503, "{}", frozen.text());
    assert_eq!(
        frozen.problem_type(),
        "urn:idempo:problem:store-unavailable"
    );
    assert!(frozen.header("retry-after").is_some());
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(get(&c, &gw.url("/readyz")).await.status, 503);
    assert_eq!(calls(), Some(1), "nothing forwarded");

    // It comes back: the same key now runs (the connection manager reconnects by itself).
    relay.resume();
    let deadline = Instant::now() + Duration::from_secs(10);
    let back = loop {
        let r = post(&c, &url, &h, "{}").await.unwrap();
        if r.status != 503 || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(back.status, 201, "{}", back.text());
    assert_eq!(calls(), Some(2));

    // The server goes away (connections closed, then refused): 503, nothing forwarded.
    relay.cut();
    let h = [("Idempotency-Key", "key-0000-redis-cut"), ALICE];
    let cut = post(&c, &url, &h, "{}").await.unwrap();
    assert_eq!(cut.status, 503, "{}", cut.text());
    assert_eq!(cut.problem_type(), "urn:idempo:problem:store-unavailable");
    assert_eq!(get(&c, &gw.url("/readyz")).await.status, 503);
    assert_eq!(calls(), Some(2), "nothing forwarded");
    let metrics = get(&c, &gw.url("/metrics")).await.text();
    assert!(
        metrics.contains("idempo_store_errors_total{route=\"/payments\",op=\"claim\"}"),
        "{metrics}"
    );
}

/// Runs `serve` on `store` and expects it to exit non-zero: its stderr.
fn serve_fails(tag: &str, store: &str) -> String {
    let dir = temp_dir(tag);
    let file = dir.join("gateway.toml");
    let up: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    std::fs::write(&file, config(store, up, "/payments", "")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idempo-gateway"))
        .args(["serve", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("cannot open the store"), "{err}");
    err
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_gateway_whose_redis_is_down_at_start_refuses_to_start() {
    // A port nothing listens on: the store cannot open, the binary exits non-zero naming it.
    let url = format!("redis://127.0.0.1:{}/0", free_port());
    serve_fails(
        "redis-absent",
        &node_store(&url, "absent", "timeout_ms = 300"),
    );
}

#[test]
fn a_url_pointing_at_a_cluster_node_is_refused() {
    let Some(nodes) = var("IDEMPO_TEST_REDIS_CLUSTER_NODES") else {
        return;
    };
    let url = format!("redis://{}", nodes.split(',').next().unwrap());
    let err = serve_fails("redis-node-of-cluster", &node_store(&url, "wrong", ""));
    assert!(err.contains("cluster_nodes"), "{err}");
}

/// A throwaway `redis-server` of the test's own with `maxmemory-policy allkeys-lru`.
struct EvictingRedis {
    child: std::process::Child,
    port: u16,
}

impl Drop for EvictingRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_server_that_may_evict_records_is_refused_unless_assumed() {
    if var("IDEMPO_TEST_REDIS_URL").is_none() {
        return;
    }
    let port = free_port();
    let child = std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(["--maxmemory-policy", "allkeys-lru"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server (scripts/setup.d/20-services.sh installs it)");
    let server = EvictingRedis { child, port };
    let url = format!("redis://127.0.0.1:{}/0", server.port);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", server.port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = serve_fails("redis-evicting", &node_store(&url, "evict", ""));
    assert!(err.contains("noeviction"), "{err}");
    assert!(err.contains("allkeys-lru"), "{err}");
    assert!(err.contains("assume_noeviction"), "{err}");
    // The operator's explicit opt-out: the gateway starts.
    let dir = temp_dir("redis-assumed");
    let store = node_store(&url, "assumed", "assume_noeviction = true");
    let up: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    let gw = Gateway::start(&dir, &config(&store, up, "/payments", ""));
    drop(gw);
    drop(server);
}

/// A Redis Cluster of the test's own with a replica per primary
/// (`scripts/test-services.sh start-cluster-replicas`), stopped on drop.
struct ReplicatedCluster {
    dir: std::path::PathBuf,
    nodes: String,
}

impl ReplicatedCluster {
    fn script() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-services.sh")
    }

    fn start(tag: &str) -> Self {
        let dir = temp_dir(tag);
        let out = std::process::Command::new("bash")
            .arg(Self::script())
            .arg("start-cluster-replicas")
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "start-cluster-replicas: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let env = std::fs::read_to_string(dir.join("env")).unwrap();
        let nodes = env
            .lines()
            .find_map(|l| l.strip_prefix("IDEMPO_TEST_REDIS_CLUSTER_NODES="))
            .unwrap()
            .to_owned();
        Self { dir, nodes }
    }

    /// `redis-cli` against the node at `port`.
    fn cli(port: &str, args: &[&str]) -> String {
        let out = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", port])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The port of one replica.
    fn a_replica(&self) -> String {
        let first = self
            .nodes
            .split(',')
            .next()
            .unwrap()
            .rsplit_once(':')
            .unwrap()
            .1;
        Self::cli(first, &["cluster", "nodes"])
            .lines()
            .find(|l| l.contains("slave"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|addr| addr.split('@').next())
            .and_then(|addr| addr.rsplit_once(':'))
            .map(|(_, port)| port.to_owned())
            .unwrap()
    }
}

impl Drop for ReplicatedCluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(Self::script())
            .arg("stop")
            .arg(&self.dir)
            .output();
    }
}

/// The answer to fresh keys once it is `status`, polling within `secs` seconds (the last one).
async fn until_status(
    c: &common::TestClient,
    url: &str,
    tag: &str,
    status: u16,
    secs: u64,
) -> common::Answer {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut n = 0_u32;
    loop {
        n += 1;
        let key = format!("key-0000-{tag}-{status}-{n:05}");
        let r = post(c, url, &[("Idempotency-Key", key.as_str()), ALICE], "{}")
            .await
            .unwrap();
        if r.status == status || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// A failover onto a replica whose maxmemory-policy may evict records: the gateway checks the new
// primaries, refuses every request (503, nothing forwarded) until the node is fixed, then serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_onto_a_primary_that_may_evict_is_refused_until_fixed() {
    if var("IDEMPO_TEST_REDIS_CLUSTER_NODES").is_none() {
        return;
    }
    let cluster = ReplicatedCluster::start("redis-failover-policy");
    let dir = temp_dir("redis-failover-gw");
    let (up, seen) = upstream().await;
    let store = cluster_store(&cluster.nodes, "failover");
    let gw = Gateway::start(&dir, &config(&store, up, "/payments", ""));
    let c = client();
    let url = gw.url("/payments");
    let ok = until_status(&c, &url, "before", 201, 5).await;
    assert_eq!(ok.status, 201, "{}", ok.text());

    // The replica was set up with a policy that evicts, then promoted.
    let replica = cluster.a_replica();
    let set = |policy: &str| {
        ReplicatedCluster::cli(&replica, &["config", "set", "maxmemory-policy", policy])
    };
    assert!(set("allkeys-lru").contains("OK"));
    assert!(ReplicatedCluster::cli(&replica, &["cluster", "failover"]).contains("OK"));
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ReplicatedCluster::cli(&replica, &["role"]).starts_with("master") {
        assert!(Instant::now() < deadline, "the replica was not promoted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The gateway reads the new primaries within its 1 s poll. A request may meet the failover
    // itself first (a 503 from a node in transition), so wait for the check's own log line.
    let deadline = Instant::now() + Duration::from_secs(15);
    let logs = loop {
        let logs = gw.logs.lock().unwrap().join("\n");
        if logs.contains("may evict records") {
            break logs;
        }
        assert!(
            Instant::now() < deadline,
            "the new primary was not checked: {logs}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(logs.contains("allkeys-lru"), "{logs}");
    assert_eq!(get(&c, &gw.url("/readyz")).await.status, 503);
    let calls = seen.lock().unwrap().calls.get("/payments").copied();
    let refused = until_status(&c, &url, "evicting", 201, 1).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(
        refused.problem_type(),
        "urn:idempo:problem:store-unavailable"
    );
    assert_eq!(
        seen.lock().unwrap().calls.get("/payments").copied(),
        calls,
        "nothing forwarded while refused"
    );

    // The operator fixes the node: served again, without a restart.
    assert!(set("noeviction").contains("OK"));
    let back = until_status(&c, &url, "fixed", 201, 15).await;
    assert_eq!(back.status, 201, "{}", back.text());
    assert_eq!(get(&c, &gw.url("/readyz")).await.status, 200);
}
