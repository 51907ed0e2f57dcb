//! Runs `spec/vectors/intent/*.json` (format: spec/vectors/README.md, "Intent vectors").
use idempo_core::intent::{PendingIntent, decide_send, request_fingerprint};
use idempo_core::retry::{AttemptOutcome, RetryDecision, RetryPolicy, StopReason};
use idempo_tests::vectors_dir;
use serde_json::Value;

fn load(name: &str) -> Value {
    let path = vectors_dir("intent").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn cases(doc: &Value) -> &Vec<Value> {
    let cases = doc["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    cases
}

fn fp(req: &Value) -> Result<String, String> {
    request_fingerprint(
        req["method"].as_str().expect("method"),
        req["target"].as_str().expect("target"),
        req["content_type"].as_str(),
        req["body"].as_str().expect("body").as_bytes(),
    )
    .map(|f| f.to_string())
    .map_err(|e| e.code().to_owned())
}

#[test]
fn fingerprint_vectors() {
    for case in cases(&load("fingerprint.json")) {
        let name = case["name"].as_str().expect("name");
        let a = fp(&case["a"]);
        if let Some(code) = case.get("error") {
            assert_eq!(a, Err(code.as_str().expect("code").to_owned()), "{name}");
            continue;
        }
        let b = fp(&case["b"]).expect(name);
        let a = a.expect(name);
        assert_eq!(a == b, case["same"].as_bool().expect("same"), "{name}");
    }
}

#[test]
fn send_vectors() {
    for case in cases(&load("send.json")) {
        let name = case["name"].as_str().expect("name");
        let pending = case["pending"].as_object().map(|p| PendingIntent {
            key: p["key"].as_str().expect("key").to_owned(),
            fingerprint: p["fingerprint"].as_str().expect("fingerprint").to_owned(),
            created_ms: p["created_ms"].as_u64().expect("created_ms"),
        });
        let got = decide_send(
            pending.as_ref(),
            case["request"].as_str().expect("request"),
            case["explicit_key"].as_str(),
        );
        match (case.get("expect"), case.get("error")) {
            (Some(e), None) => assert_eq!(
                got.map(|d| d.code()),
                Ok(e.as_str().expect("expect")),
                "{name}"
            ),
            (None, Some(e)) => assert_eq!(
                got.map_err(|e| e.code()),
                Err(e.as_str().expect("error")),
                "{name}"
            ),
            _ => panic!("{name}: needs expect or error"),
        }
    }
}

#[test]
fn settle_vectors() {
    let policy = RetryPolicy::default();
    for case in cases(&load("settle.json")) {
        let name = case["name"].as_str().expect("name");
        let o = &case["outcome"];
        let ra = o.get("retry_after_ms").and_then(Value::as_u64);
        let outcome = match o["kind"].as_str().expect("kind") {
            "response" => AttemptOutcome::Response {
                status: u16::try_from(o["status"].as_u64().expect("status")).expect("u16"),
                retry_after_ms: ra,
            },
            "timeout" => AttemptOutcome::Timeout,
            "connection_error" => AttemptOutcome::ConnectionError,
            "outcome_unknown" => AttemptOutcome::OutcomeUnknown,
            "key_reused" => AttemptOutcome::KeyReused,
            "response_not_retained" => AttemptOutcome::ResponseNotRetained,
            "in_flight" => AttemptOutcome::InFlight { retry_after_ms: ra },
            other => panic!("{name}: unknown kind {other}"),
        };
        let attempt = u32::try_from(case["attempt"].as_u64().expect("attempt")).expect("u32");
        let decision = policy
            .decide(
                attempt,
                case["elapsed_ms"].as_u64().expect("elapsed_ms"),
                &outcome,
                0.5,
            )
            .expect(name);
        let RetryDecision::Stop { reason } = decision else {
            panic!("{name}: expected a stop, got {decision:?}");
        };
        assert_eq!(
            reason.code(),
            case["reason"].as_str().expect("reason"),
            "{name}"
        );
        let status = match reason {
            StopReason::ClientError { status } | StopReason::ServerErrorNotRetryable { status } => {
                Some(u64::from(status))
            }
            _ => None,
        };
        assert_eq!(status, case.get("status").and_then(Value::as_u64), "{name}");
        assert_eq!(
            reason.settles_intent(),
            case["settles_intent"].as_bool().expect("settles_intent"),
            "{name}"
        );
    }
}
