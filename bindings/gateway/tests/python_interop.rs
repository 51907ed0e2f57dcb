//! A gateway and a Python service share one SQLite file: the Python binding's `SQLiteStore`
//! reads the record the gateway wrote (same table, same scope id, same fingerprint), and the
//! gateway answers 409 for a key a Python request holds.
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
