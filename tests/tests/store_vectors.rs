//! Runs the store conformance scenarios (`spec/vectors/store/*.json`) against the reference
//! in-memory store. Format: `spec/vectors/README.md`, "Store vectors".
use std::collections::BTreeMap;

use idempo_core::machine::store::ClaimOutcome;
use idempo_core::record::{FencingToken, FingerprintText, Record, StoredResponse};
use idempo_core::scope::ScopeId;
use idempo_tests::memstore::MemStore;
use idempo_tests::vectors_dir;
use serde_json::Value;

/// Scenario times are relative; the store's clock starts here to exercise absolute values.
const T0: u64 = 1_700_000_000_000;

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length: {s}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

struct Names {
    scopes: BTreeMap<String, ScopeId>,
    tokens: BTreeMap<String, FencingToken>,
    responses: BTreeMap<String, Vec<u8>>,
}

impl Names {
    fn load(v: &Value) -> Self {
        let obj = |k: &str| {
            v[k].as_object()
                .unwrap_or_else(|| panic!("{k} map"))
                .clone()
        };
        Self {
            scopes: obj("scopes")
                .iter()
                .map(|(k, h)| {
                    let bytes: [u8; 32] = unhex(h.as_str().expect("hex"))
                        .try_into()
                        .expect("32-byte scope");
                    (k.clone(), ScopeId::from_bytes(bytes))
                })
                .collect(),
            tokens: obj("tokens")
                .iter()
                .map(|(k, h)| {
                    let t = FencingToken::from_slice(&unhex(h.as_str().expect("hex")))
                        .expect("16-byte token");
                    (k.clone(), t)
                })
                .collect(),
            responses: obj("responses")
                .iter()
                .map(|(k, h)| (k.clone(), unhex(h.as_str().expect("hex"))))
                .collect(),
        }
    }

    fn scope(&self, step: &Value) -> ScopeId {
        self.scopes[step["scope"].as_str().expect("scope name")]
    }

    fn token(&self, step: &Value, field: &str) -> FencingToken {
        self.tokens[step[field].as_str().expect("token name")]
    }
}

fn u(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} must be an integer in {v}"))
}

/// Checks a record against its expectation (times relative to T0, names resolved).
fn check_record(names: &Names, got: Option<&Record>, want: &Value, ctx: &str) {
    let Some(got) = got else {
        assert!(want.is_null(), "{ctx}: expected {want}, got no record");
        return;
    };
    assert!(!want.is_null(), "{ctx}: expected no record, got {got:?}");
    let row = got.to_row().expect("encodable");
    assert_eq!(
        row.fingerprint,
        want["fingerprint"].as_str().expect("fp"),
        "{ctx}: fingerprint"
    );
    assert_eq!(
        row.state,
        want["state"].as_i64().expect("state"),
        "{ctx}: state"
    );
    assert_eq!(
        FencingToken::from_slice(&row.token).expect("token"),
        names.tokens[want["token"].as_str().expect("token")],
        "{ctx}: token"
    );
    let gen_ok = row.generation == want["generation"].as_i64().expect("generation")
        || (want["generation_restart_allowed"] == Value::Bool(true) && row.generation == 1);
    assert!(gen_ok, "{ctx}: generation {} vs {want}", row.generation);
    let lease = row.lease_until_ms.map(|v| v as u64 - T0);
    assert_eq!(lease, want["lease_until_ms"].as_u64(), "{ctx}: lease_until");
    assert_eq!(
        row.expires_at_ms as u64 - T0,
        u(want, "expires_at_ms"),
        "{ctx}: expires_at"
    );
    let resp = want["response"]
        .as_str()
        .map(|n| names.responses[n].clone());
    assert_eq!(row.response, resp, "{ctx}: response bytes");
}

fn run_scenario(path: &std::path::Path) -> usize {
    let text = std::fs::read_to_string(path).expect("readable vector");
    let v: Value = serde_json::from_str(&text).expect("valid JSON");
    let name = v["name"].as_str().expect("name").to_owned();
    let names = Names::load(&v);
    let mut store = MemStore::new(T0);
    let steps = v["steps"].as_array().expect("steps");
    for (i, step) in steps.iter().enumerate() {
        let ctx = format!("{name} step {i}");
        if let Some(ms) = step.get("advance_ms") {
            store.advance(ms.as_u64().expect("advance_ms"));
            continue;
        }
        let expect = &step["expect"];
        match step["op"].as_str().expect("op") {
            "claim" => {
                let fp = FingerprintText::new(step["fingerprint"].as_str().expect("fp"))
                    .expect("valid fp");
                let (out, now) = store
                    .claim(
                        names.scope(step),
                        &fp,
                        names.token(step, "token"),
                        u(step, "lease_ms"),
                        u(step, "ttl_ms"),
                    )
                    .expect("store up");
                assert_eq!(now - T0, u(expect, "now_ms"), "{ctx}: now");
                match out {
                    ClaimOutcome::Claimed { generation } => {
                        let want = &expect["claimed"];
                        assert!(want.is_object(), "{ctx}: expected {expect}, got claimed");
                        let g = u64::from(generation);
                        assert!(
                            g == u(want, "generation")
                                || (want["restart_allowed"] == Value::Bool(true) && g == 1),
                            "{ctx}: generation {g}"
                        );
                    }
                    ClaimOutcome::Existing(record) => {
                        assert!(
                            expect["existing"].is_object(),
                            "{ctx}: expected {expect}, got existing {record:?}"
                        );
                        check_record(&names, Some(&record), &expect["existing"], &ctx);
                    }
                }
            }
            "get" => {
                let (record, _) = store.get(&names.scope(step)).expect("store up");
                check_record(&names, record.as_ref(), &expect["record"], &ctx);
            }
            "takeover" => {
                let got = store
                    .takeover(
                        names.scope(step),
                        names.token(step, "seen_token"),
                        names.token(step, "new_token"),
                        u(step, "lease_ms"),
                    )
                    .expect("store up");
                assert_eq!(got.map(u64::from), expect["generation"].as_u64(), "{ctx}");
            }
            "mark_unknown" => {
                let got = store
                    .mark_unknown(
                        names.scope(step),
                        names.token(step, "seen_token"),
                        u(step, "ttl_ms"),
                    )
                    .expect("store up");
                assert_eq!(Some(got), expect["applied"].as_bool(), "{ctx}");
            }
            "complete" => {
                let bytes = &names.responses[step["response"].as_str().expect("response")];
                let resp = StoredResponse::decode(bytes).expect("vector responses decode");
                let got = store
                    .complete(
                        names.scope(step),
                        names.token(step, "token"),
                        resp,
                        u(step, "ttl_ms"),
                    )
                    .expect("store up");
                assert_eq!(Some(got), expect["applied"].as_bool(), "{ctx}");
            }
            "release" => {
                let got = store
                    .release(names.scope(step), names.token(step, "token"))
                    .expect("store up");
                assert_eq!(Some(got), expect["applied"].as_bool(), "{ctx}");
            }
            "renew" => {
                let got = store
                    .renew(
                        names.scope(step),
                        names.token(step, "token"),
                        u(step, "lease_ms"),
                    )
                    .expect("store up");
                assert_eq!(Some(got), expect["applied"].as_bool(), "{ctx}");
            }
            "purge_expired" => {
                let batch = usize::try_from(u(step, "batch")).expect("batch");
                let got = store.purge_expired(batch).expect("store up");
                assert_eq!(
                    (got.in_progress, got.completed, got.outcome_unknown),
                    (
                        u(expect, "in_progress"),
                        u(expect, "completed"),
                        u(expect, "outcome_unknown")
                    ),
                    "{ctx}"
                );
            }
            other => panic!("{ctx}: unknown op {other}"),
        }
    }
    steps.len()
}

#[test]
fn store_scenarios_pass_on_the_reference_store() {
    let dir = vectors_dir("store");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("spec/vectors/store exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 15,
        "expected the full scenario set, found {}",
        files.len()
    );
    let mut steps = 0;
    for f in &files {
        steps += run_scenario(f);
    }
    println!("{} store scenarios, {steps} steps", files.len());
}

#[test]
fn vector_responses_are_valid_encodings() {
    let text =
        std::fs::read_to_string(vectors_dir("store").join("claim_absent.json")).expect("readable");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    let names = Names::load(&v);
    for (name, bytes) in &names.responses {
        let decoded = StoredResponse::decode(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&decoded.encode().expect("re-encodes"), bytes, "{name}");
    }
}

#[test]
fn an_altered_expectation_is_caught() {
    // the runner must fail on a wrong expectation, not pass vacuously
    let dir = vectors_dir("store");
    let text = std::fs::read_to_string(dir.join("complete_checks_token.json")).expect("readable");
    let altered = text.replacen("\"applied\": false", "\"applied\": true", 1);
    assert_ne!(text, altered);
    let tmp = std::env::temp_dir().join(format!("idempo-altered-{}.json", std::process::id()));
    std::fs::write(&tmp, altered).expect("writable temp");
    let result = std::panic::catch_unwind(|| run_scenario(&tmp));
    let _ = std::fs::remove_file(&tmp);
    assert!(result.is_err(), "an altered scenario must fail");
}
