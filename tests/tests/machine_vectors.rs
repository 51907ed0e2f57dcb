//! Runs the server-flow event scripts in `spec/vectors/machine/*.json` against
//! `idempo_core::machine::ServerFlow`. Format: `spec/vectors/README.md`, "Machine vectors".
use std::num::{NonZeroU8, NonZeroU64};
use std::sync::Arc;

use idempo_core::machine::{
    Action, Cleanup, CleanupStep, Event, FlowError, HandlerResponse, ServerFlow, StoreOp,
    StoreResult,
};
use idempo_core::policy::{
    Config, HeaderAllowlist, KeyRequirement, LeasePolicy, Redaction, ResponseOrigin,
    ResponsePolicy, TakeoverPolicy,
};
use idempo_core::record::{FencingToken, FingerprintText, Record, RecordState, StoredResponse};
use idempo_core::scope::ScopeId;
use idempo_tests::vectors_dir;
use serde_json::{Value, json};

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn token(v: &Value) -> FencingToken {
    FencingToken::from_slice(&unhex(v.as_str().expect("token hex"))).expect("16 bytes")
}

fn n(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} must be an integer in {v}"))
}

fn config(c: &Value) -> Config {
    let lease = LeasePolicy::new(n(c, "lease_ms"), c["heartbeat_ms"].as_u64()).expect("lease");
    let takeover = match c["takeover"].as_str().expect("takeover") {
        "re_run" => TakeoverPolicy::ReRun,
        "outcome_unknown" => TakeoverPolicy::OutcomeUnknown,
        other => panic!("unknown takeover policy {other}"),
    };
    let transient: Vec<u16> = c["transient_statuses"]
        .as_array()
        .expect("transient_statuses")
        .iter()
        .map(|s| u16::try_from(s.as_u64().expect("status")).expect("u16"))
        .collect();
    let headers = HeaderAllowlist::new(
        c["stored_headers"]
            .as_array()
            .expect("stored_headers")
            .iter()
            .map(|h| h.as_str().expect("name").to_owned()),
    )
    .expect("allowlist");
    let response = ResponsePolicy::new(
        &transient,
        c["store_server_errors"].as_bool().expect("bool"),
        usize::try_from(n(c, "max_body_bytes")).expect("usize"),
        headers,
        Redaction::None,
    )
    .expect("response policy");
    Config {
        lease,
        takeover,
        response,
        ttl_ms: NonZeroU64::new(n(c, "ttl_ms")).expect("ttl > 0"),
        key: KeyRequirement::Required,
        in_flight_retry_after_ms: NonZeroU64::new(n(c, "in_flight_retry_after_ms")).expect("> 0"),
        unavailable_retry_after_ms: NonZeroU64::new(n(c, "unavailable_retry_after_ms"))
            .expect("> 0"),
        max_store_rounds: NonZeroU8::new(u8::try_from(n(c, "max_store_rounds")).expect("u8"))
            .expect("> 0"),
        // Optional in scripts: absent means false.
        transactional: c["transactional"].as_bool().unwrap_or(false),
        // Optional in scripts: absent means the default (30 s).
        cleanup_budget_ms: NonZeroU64::new(
            c["cleanup_budget_ms"]
                .as_u64()
                .unwrap_or(idempo_core::policy::DEFAULT_CLEANUP_BUDGET_MS),
        )
        .expect("> 0"),
        ..Config::default()
    }
}

fn headers(v: &Value) -> Vec<(String, String)> {
    v.as_array()
        .expect("headers")
        .iter()
        .map(|p| {
            (
                p[0].as_str().expect("name").to_owned(),
                p[1].as_str().expect("value").to_owned(),
            )
        })
        .collect()
}

fn record(v: &Value) -> Option<Record> {
    if v.is_null() {
        return None;
    }
    let state = match v["state"].as_u64().expect("state") {
        1 => RecordState::InProgress {
            lease_until_ms: n(v, "lease_until_ms"),
        },
        2 => {
            let r = &v["response"];
            RecordState::Completed {
                response: StoredResponse {
                    status: u16::try_from(n(r, "status")).expect("u16"),
                    headers: headers(&r["headers"]),
                    body: r["body"].as_str().expect("body").as_bytes().to_vec(),
                },
            }
        }
        3 => RecordState::OutcomeUnknown,
        other => panic!("bad state {other}"),
    };
    Some(Record {
        fingerprint: FingerprintText::new(v["fingerprint"].as_str().expect("fp")).expect("fp"),
        generation: u32::try_from(n(v, "generation")).expect("u32"),
        token: token(&v["token"]),
        expires_at_ms: n(v, "expires_at_ms"),
        state,
    })
}

fn event(v: &Value) -> Event {
    let applied = || v["applied"].as_bool().expect("applied");
    match v["type"].as_str().expect("event type") {
        "claimed" => Event::Store(StoreResult::Claimed {
            generation: u32::try_from(n(v, "generation")).expect("u32"),
            now_ms: n(v, "now_ms"),
        }),
        "existing" => Event::Store(StoreResult::Existing {
            record: record(&v["record"]).expect("existing needs a record"),
            now_ms: n(v, "now_ms"),
        }),
        "got" => Event::Store(StoreResult::Got {
            record: record(&v["record"]),
            now_ms: n(v, "now_ms"),
        }),
        "took_over" => Event::Store(StoreResult::TookOver(
            v["generation"]
                .as_u64()
                .map(|g| u32::try_from(g).expect("u32")),
        )),
        "marked_unknown" => Event::Store(StoreResult::MarkedUnknown(applied())),
        "completed" => Event::Store(StoreResult::Completed(applied())),
        "released" => Event::Store(StoreResult::Released(applied())),
        "renewed" => Event::Store(StoreResult::Renewed(applied())),
        "committed" => Event::Store(StoreResult::Committed),
        "locked" => Event::Store(StoreResult::Locked {
            now_ms: n(v, "now_ms"),
        }),
        "store_failed" => Event::StoreFailed,
        "handler_finished" => Event::HandlerFinished(HandlerResponse {
            status: u16::try_from(n(v, "status")).expect("u16"),
            headers: headers(&v["headers"]),
            body: v["body"].as_str().expect("body").as_bytes().to_vec(),
            body_to_store: v["body_to_store"].as_str().map(|s| s.as_bytes().to_vec()),
            // Optional in scripts: absent means "handler" and false.
            origin: match v["origin"].as_str().unwrap_or("handler") {
                "handler" => ResponseOrigin::Handler,
                "framework" => ResponseOrigin::Framework,
                other => panic!("unknown origin {other}"),
            },
            body_truncated: v["body_truncated"].as_bool().unwrap_or(false),
        }),
        "handler_failed" => Event::HandlerFailed {
            maybe_side_effect: v["maybe_side_effect"].as_bool().expect("bool"),
        },
        "heartbeat_due" => Event::HeartbeatDue,
        other => panic!("unknown event {other}"),
    }
}

fn pairs(h: &[(String, String)]) -> Value {
    Value::Array(h.iter().map(|(k, v)| json!([k, v])).collect())
}

/// The action as vector JSON (the scope is checked separately).
fn action_json(a: &Action, scope: &ScopeId) -> Value {
    let check_scope = |s: &ScopeId| assert_eq!(s, scope, "store op on the wrong scope");
    match a {
        Action::Store(op) => match op {
            StoreOp::Claim {
                scope: s,
                fingerprint,
                token,
                lease_ms,
                ttl_ms,
            } => {
                check_scope(s);
                json!({"action": "store", "op": "claim", "fingerprint": fingerprint.as_str(),
                       "token": hex(&token.0), "lease_ms": lease_ms, "ttl_ms": ttl_ms})
            }
            StoreOp::Get { scope: s } => {
                check_scope(s);
                json!({"action": "store", "op": "get"})
            }
            StoreOp::TakeOver {
                scope: s,
                seen_token,
                new_token,
                lease_ms,
            } => {
                check_scope(s);
                json!({"action": "store", "op": "takeover", "seen_token": hex(&seen_token.0),
                       "new_token": hex(&new_token.0), "lease_ms": lease_ms})
            }
            StoreOp::MarkUnknown {
                scope: s,
                seen_token,
                ttl_ms,
            } => {
                check_scope(s);
                json!({"action": "store", "op": "mark_unknown", "seen_token": hex(&seen_token.0),
                       "ttl_ms": ttl_ms})
            }
            StoreOp::Complete {
                scope: s,
                token,
                response,
                ttl_ms,
            } => {
                check_scope(s);
                json!({"action": "store", "op": "complete", "token": hex(&token.0),
                       "response_hex": hex(response), "ttl_ms": ttl_ms})
            }
            StoreOp::Release { scope: s, token } => {
                check_scope(s);
                json!({"action": "store", "op": "release", "token": hex(&token.0)})
            }
            StoreOp::Renew {
                scope: s,
                token,
                lease_ms,
            } => {
                check_scope(s);
                json!({"action": "store", "op": "renew", "token": hex(&token.0),
                       "lease_ms": lease_ms})
            }
            StoreOp::Commit { scope: s } => {
                check_scope(s);
                json!({"action": "store", "op": "commit"})
            }
        },
        Action::RunHandler(r) => json!({
            "action": "run_handler", "token": hex(&r.token.0), "generation": r.generation,
            "downstream_key": r.downstream_key.as_str(), "heartbeat_ms": r.heartbeat_ms}),
        Action::Wait => json!({"action": "wait"}),
        Action::LeaseLost => json!({"action": "lease_lost"}),
        Action::Respond { response, outcome } => json!({
            "action": "respond", "outcome": outcome.as_str(), "status": response.status,
            "headers": pairs(&response.headers),
            "body": String::from_utf8(response.body.clone()).expect("UTF-8 body in vectors")}),
        Action::PropagateError { outcome } => {
            json!({"action": "propagate_error", "outcome": outcome.as_str()})
        }
    }
}

fn error_json(e: &FlowError) -> Value {
    match e {
        FlowError::UnexpectedEvent { .. } => json!({"error": "unexpected_event"}),
        FlowError::Finished => json!({"error": "finished"}),
        other => panic!("unknown flow error {other:?}"),
    }
}

/// Compares an actual action with the expectation; a `problem` expectation checks the
/// problem+json body's `type` and `status` instead of its exact bytes.
fn check(got: Value, want: &Value, ctx: &str) {
    let mut got = got;
    if let Some(problem) = want.get("problem") {
        let body = got["body"].as_str().expect("problem body").to_owned();
        let parsed: Value = serde_json::from_str(&body).expect("problem body is JSON");
        assert_eq!(parsed["type"], problem["type"], "{ctx}: problem type");
        assert_eq!(parsed["status"], problem["status"], "{ctx}: problem status");
        assert!(
            parsed["title"].is_string() && parsed["detail"].is_string(),
            "{ctx}"
        );
        let obj = got.as_object_mut().expect("object");
        obj.remove("body");
        obj.insert("problem".into(), problem.clone());
    }
    assert_eq!(&got, want, "{ctx}");
}

fn run_vector(path: &std::path::Path) -> usize {
    let text = std::fs::read_to_string(path).expect("readable vector");
    let v: Value = serde_json::from_str(&text).expect("valid JSON");
    let name = v["name"].as_str().expect("name").to_owned();
    let scope_bytes: [u8; 32] = unhex(v["scope"].as_str().expect("scope"))
        .try_into()
        .expect("32 bytes");
    let scope = ScopeId::from_bytes(scope_bytes);
    let entropy: [u8; 16] = unhex(v["entropy"].as_str().expect("entropy"))
        .try_into()
        .expect("16 bytes");
    let fp = FingerprintText::new(v["fingerprint"].as_str().expect("fp")).expect("fp");
    let steps = v["steps"].as_array().expect("steps");
    let (mut flow, first) = ServerFlow::start(scope, fp, Arc::new(config(&v["config"])), entropy);
    check(
        action_json(&first, &scope),
        &steps[0]["expect"],
        &format!("{name} start"),
    );
    for (i, step) in steps.iter().enumerate().skip(1) {
        let ctx = format!("{name} step {i}");
        let got = match flow.handle(event(&step["event"])) {
            Ok(a) => {
                let mut got = action_json(&a, &scope);
                if flow.is_finished() {
                    // A finished flow's cleanup is part of its answer (absent: none).
                    if let Some(c) = flow.cleanup() {
                        got["cleanup"] = cleanup_json(c, &scope);
                    }
                }
                got
            }
            Err(e) => error_json(&e),
        };
        check(got, &step["expect"], &ctx);
    }
    let cleanup_steps = v["cleanup_steps"].as_array().map_or(&[][..], Vec::as_slice);
    if !cleanup_steps.is_empty() {
        let cleanup = flow.cleanup().expect("cleanup_steps need a cleanup");
        for (i, step) in cleanup_steps.iter().enumerate() {
            let attempt = u32::try_from(n(step, "attempt")).expect("u32");
            let got = match cleanup.next(attempt, n(step, "elapsed_ms"), &event(&step["event"])) {
                CleanupStep::RetryAfter(ms) => json!({"retry_after_ms": ms}),
                CleanupStep::Done => json!("done"),
            };
            assert_eq!(got, step["expect"], "{name} cleanup step {i}");
        }
    }
    steps.len() + cleanup_steps.len()
}

/// The cleanup as vector JSON: the op's fields plus `budget_ms`.
fn cleanup_json(c: &Cleanup, scope: &ScopeId) -> Value {
    let mut out = action_json(&Action::Store(c.op().clone()), scope);
    let obj = out.as_object_mut().expect("object");
    obj.remove("action");
    obj.insert("budget_ms".into(), json!(c.budget_ms()));
    out
}

#[test]
fn machine_vectors_pass() {
    let dir = vectors_dir("machine");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("spec/vectors/machine exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 43,
        "expected the full script set, found {}",
        files.len()
    );
    let steps: usize = files.iter().map(|f| run_vector(f)).sum();
    println!("{} machine scripts, {steps} steps", files.len());
}

#[test]
fn an_altered_script_is_caught() {
    let dir = vectors_dir("machine");
    let text = std::fs::read_to_string(dir.join("in_flight_live_lease.json")).expect("readable");
    let altered = text.replacen("\"3\"", "\"2\"", 1);
    assert_ne!(text, altered);
    let tmp = std::env::temp_dir().join(format!("idempo-altered-m-{}.json", std::process::id()));
    std::fs::write(&tmp, altered).expect("writable temp");
    let result = std::panic::catch_unwind(|| run_vector(&tmp));
    let _ = std::fs::remove_file(&tmp);
    assert!(result.is_err(), "an altered script must fail");
}
