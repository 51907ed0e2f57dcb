//! Runs the cache-rule vectors (`spec/vectors/cache/*.json`) against core's pure cache rule
//! (`idempo_core::machine::cache`). Format: `spec/vectors/README.md`, "Cache vectors".
use idempo_core::machine::cache::{self, CacheAnswer};
use idempo_core::policy::Config;
use idempo_core::record::{FencingToken, FingerprintText, Record, RecordState, StoredResponse};
use idempo_tests::vectors_dir;
use serde_json::Value;

fn load(name: &str) -> Vec<Value> {
    let path = vectors_dir("cache").join(format!("{name}.json"));
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("readable")).expect("JSON");
    let cases = v["cases"].as_array().expect("cases").clone();
    assert!(cases.len() >= 5, "{name}: {} cases", cases.len());
    cases
}

fn u(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {v}"))
}

fn state(v: &Value) -> i64 {
    v["state"].as_i64().expect("state")
}

#[test]
fn serve_rule_matches_the_vectors() {
    for c in load("serve") {
        let got = cache::servable(state(&c), u(&c, "expires_at_ms"), u(&c, "cache_now_ms"));
        assert_eq!(Some(got), c["expect"].as_bool(), "{}", c["note"]);
    }
}

#[test]
fn fill_px_matches_the_vectors() {
    for c in load("fill") {
        let got = cache::fill_px_ms(
            state(&c),
            u(&c, "expires_at_ms"),
            u(&c, "cache_ttl_ms"),
            u(&c, "read_now_ms"),
            u(&c, "elapsed_ms"),
        );
        assert_eq!(got, c["expect"].as_u64(), "{}", c["note"]);
    }
}

#[test]
fn answer_matches_the_vectors() {
    let fp = |v: &Value, k: &str| FingerprintText::new(v[k].as_str().expect(k)).expect("fp");
    let response = StoredResponse {
        status: 201,
        headers: vec![],
        body: b"{}".to_vec(),
    };
    for c in load("answer") {
        let record = Record {
            fingerprint: fp(&c, "record_fingerprint"),
            generation: 1,
            token: FencingToken([0; 16]),
            expires_at_ms: u(&c, "expires_at_ms"),
            state: match state(&c) {
                1 => RecordState::InProgress {
                    lease_until_ms: u(&c, "expires_at_ms"),
                },
                2 => RecordState::Completed {
                    response: response.clone(),
                },
                _ => RecordState::OutcomeUnknown,
            },
        };
        let got = match cache::answer(
            &record,
            &fp(&c, "request_fingerprint"),
            u(&c, "cache_now_ms"),
            &Config::default(),
        ) {
            CacheAnswer::Replay(r) => {
                assert_eq!(r, &response);
                "replay"
            }
            CacheAnswer::Mismatch => "mismatch",
            CacheAnswer::FallThrough => "fall_through",
        };
        assert_eq!(Some(got), c["expect"].as_str(), "{}", c["note"]);
    }
}
