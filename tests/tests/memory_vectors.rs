//! Runs the memory-store scenarios (`spec/vectors/memory/*.json`) against core's bounded memory
//! store (`idempo_core::machine::memory`). Format: `spec/vectors/README.md`, "Memory-store
//! vectors".
use std::collections::BTreeMap;

use idempo_core::machine::memory::{MemoryError, MemoryLimits, MemoryStore, Partition};
use idempo_core::machine::store::ClaimOutcome;
use idempo_core::record::{FencingToken, FingerprintText, Record, StoredResponse};
use idempo_core::scope::ScopeId;
use idempo_tests::vectors_dir;
use serde_json::Value;

/// Scenario times are relative; the store's clock starts here.
const T0: u64 = 1_700_000_000_000;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn u(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} must be an integer in {v}"))
}

fn usize_of(v: &Value, field: &str) -> usize {
    usize::try_from(u(v, field)).unwrap_or(usize::MAX)
}

struct Names {
    scopes: BTreeMap<String, ScopeId>,
    tokens: BTreeMap<String, FencingToken>,
    responses: BTreeMap<String, Vec<u8>>,
    partitions: BTreeMap<String, Partition>,
}

impl Names {
    fn load(v: &Value, ctx: &str) -> Self {
        let obj = |k: &str| {
            v[k].as_object()
                .unwrap_or_else(|| panic!("{k} map"))
                .clone()
        };
        let partitions = obj("principals")
            .iter()
            .map(|(name, p)| {
                let derived = Partition::of_principal(p["principal"].as_str().expect("principal"));
                let want = unhex(p["partition"].as_str().expect("partition hex"));
                assert_eq!(
                    derived.as_bytes().as_slice(),
                    want.as_slice(),
                    "{ctx}: partition of {name}"
                );
                (name.clone(), derived)
            })
            .collect();
        Self {
            scopes: obj("scopes")
                .iter()
                .map(|(k, h)| {
                    let b: [u8; 32] = unhex(h.as_str().expect("hex")).try_into().expect("32");
                    (k.clone(), ScopeId::from_bytes(b))
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
            partitions,
        }
    }

    fn scope(&self, step: &Value) -> ScopeId {
        self.scopes[step["scope"].as_str().expect("scope name")]
    }

    fn token(&self, step: &Value, field: &str) -> FencingToken {
        self.tokens[step[field].as_str().expect("token name")]
    }
}

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
        "{ctx}"
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
    assert_eq!(
        row.generation,
        want["generation"].as_i64().expect("gen"),
        "{ctx}"
    );
    assert_eq!(
        row.lease_until_ms.map(|v| v as u64 - T0),
        want["lease_until_ms"].as_u64(),
        "{ctx}: lease_until"
    );
    assert_eq!(
        row.expires_at_ms as u64 - T0,
        u(want, "expires_at_ms"),
        "{ctx}"
    );
    let resp = want["response"]
        .as_str()
        .map(|n| names.responses[n].clone());
    assert_eq!(row.response, resp, "{ctx}: response bytes");
}

fn check_refusal(got: MemoryError, want: &Value, ctx: &str) {
    assert_eq!(
        got.as_str(),
        want["error"].as_str().expect("error"),
        "{ctx}"
    );
    assert_eq!(
        got.retry_after_ms(),
        u(want, "retry_after_ms"),
        "{ctx}: retry_after_ms"
    );
}

fn run(path: &std::path::Path) -> usize {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("readable")).expect("JSON");
    let name = v["name"].as_str().expect("name").to_owned();
    let names = Names::load(&v, &name);
    let l = &v["limits"];
    let mut store = MemoryStore::new(MemoryLimits {
        max_entries: usize_of(l, "max_entries"),
        max_bytes: usize_of(l, "max_bytes"),
        max_entries_per_partition: usize_of(l, "max_entries_per_partition"),
        max_bytes_per_partition: usize_of(l, "max_bytes_per_partition"),
    });
    let mut now = T0;
    let steps = v["steps"].as_array().expect("steps");
    for (i, step) in steps.iter().enumerate() {
        let ctx = format!("{name} step {i}");
        if let Some(ms) = step.get("advance_ms") {
            now += ms.as_u64().expect("advance_ms");
            continue;
        }
        let expect = &step["expect"];
        match step["op"].as_str().expect("op") {
            "claim" => {
                let fp = FingerprintText::new(step["fingerprint"].as_str().expect("fp"))
                    .expect("valid fp");
                let partition = step["principal"].as_str().map(|p| names.partitions[p]);
                assert_eq!(now - T0, u(expect, "now_ms"), "{ctx}: now");
                let got = store.claim(
                    names.scope(step),
                    partition,
                    &fp,
                    names.token(step, "token"),
                    u(step, "lease_ms"),
                    u(step, "ttl_ms"),
                    now,
                );
                match got {
                    Ok(ClaimOutcome::Claimed { generation }) => {
                        assert!(expect["claimed"].is_object(), "{ctx}: got claimed");
                        assert_eq!(u64::from(generation), u(&expect["claimed"], "generation"));
                    }
                    Ok(ClaimOutcome::Existing(r)) => {
                        assert!(expect["existing"].is_object(), "{ctx}: got existing {r:?}");
                        check_record(&names, Some(&r), &expect["existing"], &ctx);
                    }
                    Err(e) => {
                        assert!(expect["refused"].is_object(), "{ctx}: got refused {e:?}");
                        check_refusal(e, &expect["refused"], &ctx);
                    }
                }
            }
            "get" => check_record(
                &names,
                store.get(&names.scope(step)),
                &expect["record"],
                &ctx,
            ),
            "complete" => {
                let bytes = &names.responses[step["response"].as_str().expect("response")];
                let resp = StoredResponse::decode(bytes).expect("vector responses decode");
                match store.complete(
                    names.scope(step),
                    names.token(step, "token"),
                    resp,
                    u(step, "ttl_ms"),
                    now,
                ) {
                    Ok(applied) => assert_eq!(Some(applied), expect["applied"].as_bool(), "{ctx}"),
                    Err(e) => {
                        assert!(expect["refused"].is_object(), "{ctx}: got refused {e:?}");
                        check_refusal(e, &expect["refused"], &ctx);
                    }
                }
            }
            "release" => {
                let got = store.release(names.scope(step), names.token(step, "token"));
                assert_eq!(Some(got), expect["applied"].as_bool(), "{ctx}");
            }
            "purge_expired" => {
                let got = store.purge_expired(usize_of(step, "batch"), now);
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
            "len" => {
                assert_eq!(store.len() as u64, u(expect, "entries"), "{ctx}: entries");
                if let Some(b) = expect.get("bytes") {
                    assert_eq!(Some(store.bytes() as u64), b.as_u64(), "{ctx}: bytes");
                }
            }
            other => panic!("{ctx}: unknown op {other}"),
        }
    }
    steps.len()
}

#[test]
fn memory_scenarios_pass_on_cores_memory_store() {
    let dir = vectors_dir("memory");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("spec/vectors/memory exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 5,
        "expected the scenario set, found {}",
        files.len()
    );
    let steps: usize = files.iter().map(|f| run(f)).sum();
    assert!(steps > 40, "{steps} steps");
}
