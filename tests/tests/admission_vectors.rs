//! Runs `spec/vectors/admission/*.json` (format: spec/vectors/README.md, "Admission vectors")
//! through core's staged admission (`machine::admit`).
use idempo_core::fingerprint::{FingerprintConfig, Fingerprinter, RequestParts};
use idempo_core::machine::{
    BodyRead, BodyStage, KeyStage, Refusal, ScopeResolution, ScopeRule, ScopeStage, admit,
};
use idempo_core::policy::ConfigOptions;
use idempo_core::scope::ScopeId;
use idempo_tests::vectors_dir;
use serde_json::Value;

fn options(c: &Value) -> ConfigOptions {
    let u = |k: &str| c[k].as_u64();
    ConfigOptions {
        key_required: c["key_required"].as_bool(),
        key_min_len: u("key_min_len").map(|v| usize::try_from(v).expect("usize")),
        key_max_len: u("key_max_len").map(|v| usize::try_from(v).expect("usize")),
        key_strict: c["key_strict"].as_bool(),
        max_request_body_bytes: u("max_request_body_bytes")
            .map(|v| usize::try_from(v).expect("usize")),
        ..ConfigOptions::default()
    }
}

fn check_refusal(name: &str, r: &Refusal, expect: &Value) {
    assert_eq!(expect["result"], "refuse", "{name}: refused with {r:?}");
    assert_eq!(
        u64::from(r.response.status),
        expect["status"].as_u64().expect("status"),
        "{name}"
    );
    let body: Value = serde_json::from_slice(&r.response.body).expect("problem json");
    assert_eq!(body["type"], expect["type"], "{name}");
    assert_eq!(
        r.outcome(),
        expect["outcome"].as_str().expect("outcome"),
        "{name}"
    );
    if let Some(code) = expect.get("code") {
        assert_eq!(&body["code"], code, "{name}: code");
    }
    assert_eq!(
        r.log.is_some(),
        expect["log"].as_bool().expect("log"),
        "{name}: log"
    );
}

#[test]
fn admission_vectors() {
    let path = vectors_dir("admission").join("admission.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: Value = serde_json::from_str(&text).expect("json");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20);
    let fingerprinter = Fingerprinter::new(&FingerprintConfig::default()).expect("default");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let config = options(&case["config"]).build().expect("config");
        let req = &case["request"];
        let expect = &case["expect"];
        let s = |k: &str| req[k].as_str().unwrap_or_else(|| panic!("{name}: {k}"));
        let fields: Vec<Vec<u8>> = req["key_fields"]
            .as_array()
            .expect("key_fields")
            .iter()
            .map(|v| v.as_str().expect("field").as_bytes().to_vec())
            .collect();
        let fields: Vec<&[u8]> = fields.iter().map(Vec::as_slice).collect();
        let body = s("body").as_bytes();
        let waiting = match admit(&config, &fields, req["declared_length"].as_u64()) {
            KeyStage::PassThrough => {
                assert_eq!(expect["result"], "pass_through", "{name}");
                continue;
            }
            KeyStage::Refuse(r) => {
                check_refusal(name, &r, expect);
                continue;
            }
            KeyStage::Continue(w) => w,
        };
        // A host reads at most the limit plus one chunk; here the chunk is the whole body.
        let read = if body.len() > waiting.body_limit() {
            BodyRead::OverLimit {
                read: u64::try_from(body.len()).expect("u64"),
            }
        } else {
            BodyRead::Complete(RequestParts {
                method: s("method"),
                route: s("target"),
                headers: &[],
                content_type: Some(s("content_type")),
                body,
            })
        };
        let scoping = match waiting.body(read, &fingerprinter).expect("fingerprinter") {
            BodyStage::Refuse(r) => {
                check_refusal(name, &r, expect);
                continue;
            }
            BodyStage::Continue(w) => w,
        };
        let sc = &case["scope"];
        let b = |k: &str| {
            sc[k]
                .as_bool()
                .unwrap_or_else(|| panic!("{name}: scope.{k}"))
        };
        let rule =
            ScopeRule::new(b("function"), b("public"), b("empty_is_anonymous")).expect("rule");
        let returns = &sc["returns"];
        let number = returns["number"].to_string();
        let resolution = if !b("function") {
            ScopeResolution::NotCalled
        } else if let Some(p) = returns["principal"].as_str() {
            ScopeResolution::Principal(p)
        } else if returns["nothing"] == true {
            ScopeResolution::Nothing("None")
        } else if returns.get("number").is_some() {
            ScopeResolution::NotAString(&number)
        } else if let Some(msg) = returns["raises"].as_str() {
            ScopeResolution::Raised(msg)
        } else {
            panic!("{name}: unknown scope return {returns}");
        };
        let key = scoping.key().clone();
        let authenticated = req["authenticated"].as_bool().expect("authenticated");
        match scoping.scope(rule, resolution, authenticated, s("method"), s("route")) {
            ScopeStage::Refuse(r) => check_refusal(name, &r, expect),
            ScopeStage::Admitted(a) => {
                assert_eq!(expect["result"], "admitted", "{name}");
                let principal = expect["principal"].as_str().expect("principal");
                assert_eq!(
                    a.scope,
                    ScopeId::new(principal, s("method"), s("route"), &key),
                    "{name}: scope id"
                );
                assert_eq!(
                    a.warning.is_some(),
                    expect["warning"].as_bool().expect("warning"),
                    "{name}: warning"
                );
            }
        }
    }
}
