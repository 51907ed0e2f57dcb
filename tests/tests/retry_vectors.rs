//! Runs `spec/vectors/retry/*.json` (format: spec/vectors/README.md, "Retry vectors").
use idempo_core::retry::{
    AttemptOutcome, Jitter, RetryConfig, RetryDecision, RetryPolicy, StopReason, parse_retry_after,
};
use idempo_tests::vectors_dir;
use serde_json::Value;

fn load(name: &str) -> Value {
    let path = vectors_dir("retry").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn config(v: &Value) -> RetryConfig {
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    RetryConfig {
        max_attempts: u32::try_from(n("max_attempts")).expect("u32"),
        base_delay_ms: n("base_delay_ms"),
        max_delay_ms: n("max_delay_ms"),
        max_elapsed_ms: n("max_elapsed_ms"),
        jitter: match v["jitter"].as_str().expect("jitter") {
            "equal" => Jitter::Equal,
            "full" => Jitter::Full,
            other => panic!("unknown jitter mode {other}"),
        },
    }
}

fn outcome(v: &Value) -> AttemptOutcome {
    match v["kind"].as_str().expect("kind") {
        "response" => AttemptOutcome::Response {
            status: u16::try_from(v["status"].as_u64().expect("status")).expect("u16"),
            retry_after_ms: v
                .get("retry_after_ms")
                .map(|r| r.as_u64().expect("retry_after_ms")),
        },
        "timeout" => AttemptOutcome::Timeout,
        "connection_error" => AttemptOutcome::ConnectionError,
        "outcome_unknown" => AttemptOutcome::OutcomeUnknown,
        "key_reused" => AttemptOutcome::KeyReused,
        "response_not_retained" => AttemptOutcome::ResponseNotRetained,
        "in_flight" => AttemptOutcome::InFlight {
            retry_after_ms: v
                .get("retry_after_ms")
                .map(|r| r.as_u64().expect("retry_after_ms")),
        },
        other => panic!("unknown outcome kind {other}"),
    }
}

fn jitter(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().expect("f64"),
        Value::String(s) => match s.as_str() {
            "NaN" => f64::NAN,
            "Infinity" => f64::INFINITY,
            "-Infinity" => f64::NEG_INFINITY,
            other => panic!("unknown jitter literal {other}"),
        },
        _ => panic!("jitter must be a number or a string"),
    }
}

fn stop_status(r: &StopReason) -> Option<u16> {
    match r {
        StopReason::ClientError { status } | StopReason::ServerErrorNotRetryable { status } => {
            Some(*status)
        }
        _ => None,
    }
}

#[test]
fn decide_vectors() {
    let doc = load("decide.json");
    let mut count = 0;
    for group in doc["groups"].as_array().expect("groups") {
        let policy = RetryPolicy::new(config(&group["policy"])).expect("vector policies are valid");
        for case in group["cases"].as_array().expect("cases") {
            let name = format!(
                "{}/{}",
                group["name"].as_str().expect("g"),
                case["name"].as_str().expect("n")
            );
            let attempt = u32::try_from(case["attempt"].as_u64().expect("attempt")).expect("u32");
            let elapsed = case["elapsed_ms"].as_u64().expect("elapsed");
            let got = policy.decide(
                attempt,
                elapsed,
                &outcome(&case["outcome"]),
                jitter(&case["jitter"]),
            );
            let expect = &case["expect"];
            if let Some(code) = expect["error"].as_str() {
                assert_eq!(got.map_err(|e| e.code()), Err(code), "{name}");
            } else if let Some(delay) = expect["retry"].as_u64() {
                assert_eq!(got, Ok(RetryDecision::Retry { delay_ms: delay }), "{name}");
            } else {
                let reason = expect["stop"].as_str().expect("stop");
                match got {
                    Ok(RetryDecision::Stop { reason: r }) => {
                        assert_eq!(r.code(), reason, "{name}");
                        assert_eq!(
                            stop_status(&r).map(u64::from),
                            expect.get("status").and_then(Value::as_u64),
                            "{name}"
                        );
                    }
                    other => panic!("{name}: expected stop {reason}, got {other:?}"),
                }
            }
            count += 1;
        }
    }
    assert!(count >= 150, "expected the full vector set, got {count}");
    println!("retry decide vectors: {count}");
}

#[test]
fn config_vectors() {
    let doc = load("config.json");
    for case in doc["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let got = RetryPolicy::new(config(&case["policy"]));
        match case["expect"].as_str().expect("expect") {
            "ok" => assert!(got.is_ok(), "{name}: {got:?}"),
            code => assert_eq!(got.map_err(|e| e.code()).err(), Some(code), "{name}"),
        }
    }
}

#[test]
fn retry_after_vectors() {
    let doc = load("retry_after.json");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 40);
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let got = parse_retry_after(
            case["value"].as_str().expect("value"),
            case["now_ms"].as_u64().expect("now"),
        );
        assert_eq!(got, case["expect_ms"].as_u64(), "{name}");
    }
}

#[test]
fn outcome_vectors() {
    let doc = load("outcome.json");
    let limit = usize::try_from(doc["body_limit"].as_u64().expect("body_limit")).expect("usize");
    assert_eq!(limit, idempo_core::retry::OUTCOME_UNKNOWN_BODY_LIMIT);
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20);
    let mut unknown = 0;
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let status = u16::try_from(case["status"].as_u64().expect("status")).expect("u16");
        let retry_after_ms = case.get("retry_after_ms").and_then(Value::as_u64);
        let content_type = case["content_type"].as_str();
        let body = case["body"].as_str().expect("body").as_bytes();
        let got = AttemptOutcome::from_response(status, retry_after_ms, content_type, body);
        let want = match case["expect"].as_str().expect("expect") {
            "outcome_unknown" => {
                unknown += 1;
                AttemptOutcome::OutcomeUnknown
            }
            "response" => AttemptOutcome::Response {
                status,
                retry_after_ms,
            },
            "key_reused" => AttemptOutcome::KeyReused,
            "response_not_retained" => AttemptOutcome::ResponseNotRetained,
            "in_flight" => AttemptOutcome::InFlight { retry_after_ms },
            other => panic!("{name}: unknown expectation {other}"),
        };
        assert_eq!(got, want, "{name}");
        assert_eq!(
            got.kind(),
            case["expect"].as_str().expect("expect"),
            "{name}"
        );
        if !matches!(got, AttemptOutcome::Response { .. }) {
            assert!(AttemptOutcome::body_needed(status, content_type), "{name}");
        }
    }
    assert!(unknown >= 5);
    println!("retry outcome vectors: {}", cases.len());
}
