//! A gateway and a Python service share one SQLite file: the Python binding's `SQLiteStore`
//! reads the record the gateway wrote (same table, same scope id, same fingerprint), and the
//! gateway answers 409 for a key a Python request holds. Likewise on one Redis and on one Redis
//! Cluster (`IDEMPO_TEST_REDIS_URL`, `IDEMPO_TEST_REDIS_CLUSTER_NODES`, skipped with a notice
//! when unset): the Python `RedisStore` reads the gateway's record, and the gateway replays a
//! record the Python store completed without calling the upstream.
//!
//! Needs the Python package (`make setup` builds it into `.venv`; `IDEMPO_PYTHON` names another
//! interpreter). Without it the test prints a notice and passes, as the suite's other optional
//! inputs do (`tests/src/lib.rs`, `shared_jcs_dir`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{Gateway, client, config, post, temp_dir, upstream};

fn python() -> Option<PathBuf> {
    let candidate = std::env::var_os("IDEMPO_PYTHON").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"),
        PathBuf::from,
    );
    let ok = Command::new(&candidate)
        .args(["-c", "import idempo.stores"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!(
            "python_interop: no Python with the idempo package at {} (make setup builds it); skipped",
            candidate.display()
        );
    }
    ok.then_some(candidate)
}

const SCRIPT: &str = r#"
import json, os, sys
import idempo
from idempo.stores import SQLiteStore
from idempo.stores._base import Claimed

path, read_key, claim_key, body = sys.argv[1:5]
store = SQLiteStore(path)
fp = idempo.Fingerprinter().fingerprint("POST", "/payments", body.encode(), content_type="application/json")
record, now = store.get(idempo.scope_id("alice", "POST", "/payments", read_key))
claimed = store.claim(idempo.scope_id("alice", "POST", "/payments", claim_key), fp, os.urandom(16), 30000, 60000)
print(json.dumps({
    "state": record.state if record else None,
    "same_fingerprint": record is not None and record.fingerprint == fp,
    "response_has_body": record is not None and b"succeeded" in (record.response or b""),
    "claimed": isinstance(claimed, Claimed),
}))
"#;

#[tokio::test]
async fn a_python_service_and_the_gateway_share_one_sqlite_file() {
    let Some(py) = python() else {
        return;
    };
    let dir = temp_dir("python");
    let db = dir.join("shared.sqlite3");
    let (up, seen) = upstream().await;
    let store = format!("kind = \"sqlite\"\npath = \"{}\"", db.display());
    let gw = Gateway::start(&dir, &config(&store, up, "/payments", ""));
    let c = client();
    let body = r#"{"amount":42}"#;
    let alice = ("X-Principal", "alice");
    let first = post(
        &c,
        &gw.url("/payments"),
        &[("Idempotency-Key", "key-0000-py-read"), alice],
        body,
    )
    .await
    .unwrap();
    assert_eq!(first.status, 201);
    let out = Command::new(&py)
        .args(["-c", SCRIPT])
        .arg(&db)
        .args(["key-0000-py-read", "key-0000-py-claim", body])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        got["state"], 2,
        "Python reads the gateway's completed record: {got}"
    );
    assert_eq!(got["same_fingerprint"], true, "{got}");
    assert_eq!(got["response_has_body"], true, "{got}");
    assert_eq!(got["claimed"], true, "{got}");
    // The key Python holds in flight is 409 through the gateway; nothing is forwarded.
    let dup = post(
        &c,
        &gw.url("/payments"),
        &[("Idempotency-Key", "key-0000-py-claim"), alice],
        body,
    )
    .await
    .unwrap();
    assert_eq!(dup.status, 409, "{}", dup.text());
    assert_eq!(seen.lock().unwrap().calls.get("/payments"), Some(&1));
}

const REDIS_SCRIPT: &str = r#"
import json, os, sys
import idempo
from idempo.stores import RedisStore
from idempo.stores._base import Claimed

url, cluster, prefix, read_key, claim_key, done_key, body = sys.argv[1:8]
store = RedisStore(url, cluster=cluster == "1", prefix=prefix.encode())
fp = idempo.Fingerprinter().fingerprint("POST", "/payments", body.encode(), content_type="application/json")
scope = lambda key: idempo.scope_id("alice", "POST", "/payments", key)
record, now = store.get(scope(read_key))
claimed = store.claim(scope(claim_key), fp, os.urandom(16), 30000, 60000)
token = os.urandom(16)
done = store.claim(scope(done_key), fp, token, 30000, 60000)
response = idempo.encode_response(201, [("content-type", "application/json")], b'{"from":"python"}')
completed = isinstance(done, Claimed) and store.complete(scope(done_key), token, response, 60000)
print(json.dumps({
    "state": record.state if record else None,
    "same_fingerprint": record is not None and record.fingerprint == fp,
    "response_has_body": record is not None and b"succeeded" in (record.response or b""),
    "claimed": isinstance(claimed, Claimed),
    "completed": bool(completed),
}))
store.close()
"#;

/// The gateway and a Python service on one Redis (`cluster`: a Redis Cluster seeded by `url`).
async fn share_one_redis(
    py: &std::path::Path,
    store: &str,
    url: &str,
    cluster: bool,
    prefix: &str,
) {
    let dir = temp_dir(if cluster {
        "python-redis-cluster"
    } else {
        "python-redis"
    });
    let (up, seen) = upstream().await;
    let gw = Gateway::start(&dir, &config(store, up, "/payments", ""));
    let c = client();
    let body = r#"{"amount":42}"#;
    let alice = ("X-Principal", "alice");
    let tag = format!("{}-{}", u8::from(cluster), std::process::id());
    let (read, claim, done) = (
        format!("key-0000-py-read-{tag}"),
        format!("key-0000-py-claim-{tag}"),
        format!("key-0000-py-done-{tag}"),
    );
    let first = post(
        &c,
        &gw.url("/payments"),
        &[("Idempotency-Key", &read), alice],
        body,
    )
    .await
    .unwrap();
    assert_eq!(first.status, 201, "{}", first.text());
    let out = Command::new(py)
        .args([
            "-c",
            REDIS_SCRIPT,
            url,
            if cluster { "1" } else { "0" },
            prefix,
        ])
        .args([&read, &claim, &done, body])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        got["state"], 2,
        "Python reads the gateway's completed record: {got}"
    );
    assert_eq!(got["same_fingerprint"], true, "{got}");
    assert_eq!(got["response_has_body"], true, "{got}");
    assert_eq!(got["claimed"], true, "{got}");
    assert_eq!(got["completed"], true, "{got}");
    // The key Python holds in flight is 409 through the gateway; nothing is forwarded.
    let dup = post(
        &c,
        &gw.url("/payments"),
        &[("Idempotency-Key", &claim), alice],
        body,
    )
    .await
    .unwrap();
    assert_eq!(dup.status, 409, "{}", dup.text());
    // The record Python completed is replayed by the gateway; nothing is forwarded.
    let replay = post(
        &c,
        &gw.url("/payments"),
        &[("Idempotency-Key", &done), alice],
        body,
    )
    .await
    .unwrap();
    assert_eq!(replay.status, 201, "{}", replay.text());
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.body, br#"{"from":"python"}"#);
    assert_eq!(seen.lock().unwrap().calls.get("/payments"), Some(&1));
}

#[tokio::test]
async fn a_python_service_and_the_gateway_share_one_redis() {
    let Ok(url) = std::env::var("IDEMPO_TEST_REDIS_URL") else {
        println!("python_interop: IDEMPO_TEST_REDIS_URL is not set; skipped");
        return;
    };
    let Some(py) = python() else {
        return;
    };
    let prefix = format!("idempo:gwpy:{}:", std::process::id());
    let store = format!("kind = \"redis\"\nurl = \"{url}\"\nprefix = \"{prefix}\"");
    share_one_redis(&py, &store, &url, false, &prefix).await;
}

#[tokio::test]
async fn a_python_service_and_the_gateway_share_one_redis_cluster() {
    let Ok(nodes) = std::env::var("IDEMPO_TEST_REDIS_CLUSTER_NODES") else {
        println!("python_interop: IDEMPO_TEST_REDIS_CLUSTER_NODES is not set; skipped");
        return;
    };
    let Some(py) = python() else {
        return;
    };
    let prefix = format!("idempo:gwpyc:{}:", std::process::id());
    let list: Vec<String> = nodes
        .split(',')
        .map(|n| format!("\"redis://{n}\""))
        .collect();
    let store = format!(
        "kind = \"redis\"\ncluster_nodes = [{}]\nprefix = \"{prefix}\"",
        list.join(", ")
    );
    let seed = format!("redis://{}", nodes.split(',').next().unwrap());
    share_one_redis(&py, &store, &seed, true, &prefix).await;
}
