//! Runs `spec/vectors/scope/*.json` (format: spec/vectors/README.md, "Scope vectors").
use idempo_core::key::{IdempotencyKey, KeyOptions};
use idempo_core::scope::ScopeId;
use idempo_tests::vectors_dir;
use serde_json::Value;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn scope_vectors() {
    let path = vectors_dir("scope").join("scope.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: Value = serde_json::from_str(&text).expect("json");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 15);
    let wide = KeyOptions::new(1, 255).expect("options");
    for case in cases {
        let s = |k: &str| case[k].as_str().unwrap_or_else(|| panic!("{k}"));
        let name = s("name");
        let (p, m, r, k) = (s("principal"), s("method"), s("route"), s("key"));
        assert_eq!(
            hex(&ScopeId::framing(p, m, r, k)),
            s("framing_hex"),
            "{name}: framing"
        );
        let id = ScopeId::from_parts(p, m, r, k);
        assert_eq!(id.to_hex(), s("scope_hex"), "{name}");
        assert_eq!(s("scope_hex").parse::<ScopeId>(), Ok(id), "{name}: FromStr");
        // Through a validated key, where the key is a valid one.
        if let Ok(key) = IdempotencyKey::from_text(k, &wide) {
            assert_eq!(ScopeId::new(p, m, r, &key), id, "{name}: new vs from_parts");
        }
    }
    // The pairs the vectors exist for must really differ (or match).
    let by = |n: &str| {
        cases
            .iter()
            .find(|c| c["name"] == n)
            .map(|c| c["scope_hex"].as_str().expect("hex").to_owned())
            .expect(n)
    };
    assert_ne!(by("separator_in_principal"), by("separator_in_route"));
    assert_ne!(
        by("empty_principal_anonymous"),
        by("principal_equal_to_method_shift")
    );
    assert_ne!(
        by("key_case_sensitive_lower"),
        by("key_case_sensitive_upper")
    );
    assert_eq!(by("basic"), by("method_lowercase_is_upper_cased"));
    assert_ne!(by("basic"), by("other_principal_same_key"));
    assert_ne!(by("basic"), by("other_route_same_key"));
    assert_ne!(by("basic"), by("other_method_same_key"));
}
