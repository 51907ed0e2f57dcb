//! Fingerprint vectors (`spec/vectors/fingerprint/fingerprint.json`, format in
//! `spec/vectors/README.md`): the digest text, the canonical body, and errors.

use std::fs;

use idempo_core::canonical::{CanonOptions, Exclusions, NumberMode, canonicalize_excluding_to};
use idempo_core::fingerprint::{
    Fingerprint, FingerprintConfig, FingerprintError, RequestParts, fingerprint,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn config(v: &Value) -> FingerprintConfig {
    let strings = |k: &str| -> Vec<String> {
        v.get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|s| s.as_str().expect("string").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    FingerprintConfig {
        header_names: strings("header_names"),
        exclude: strings("exclude"),
        numbers: match v.get("numbers").and_then(Value::as_str) {
            None | Some("reject_precision_loss") => NumberMode::RejectPrecisionLoss,
            Some("rfc") => NumberMode::Rfc,
            Some(other) => panic!("unknown numbers mode {other}"),
        },
        hmac_key: v.get("hmac_key_hex").and_then(Value::as_str).map(hex),
        ..FingerprintConfig::default()
    }
}

#[test]
fn fingerprint_vectors() {
    let path = idempo_tests::vectors_dir("fingerprint").join("fingerprint.json");
    let doc: Value = serde_json::from_slice(&fs::read(&path).expect("read")).expect("JSON");
    assert_eq!(doc["format"], "idempo-fingerprint-vectors/1");
    let cases = doc["cases"].as_array().expect("cases");
    let (mut ok, mut rejected) = (0, 0);
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let cfg = config(&case["config"]);
        let req = &case["request"];
        let headers: Vec<(String, String)> = req["headers"]
            .as_array()
            .expect("headers")
            .iter()
            .map(|p| {
                (
                    p[0].as_str().expect("name").to_owned(),
                    p[1].as_str().expect("value").to_owned(),
                )
            })
            .collect();
        let header_refs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let body = match (req.get("body"), req.get("body_hex")) {
            (Some(Value::String(s)), None) => s.as_bytes().to_vec(),
            (None, Some(Value::String(h))) => hex(h),
            _ => panic!("{name}: exactly one of body / body_hex"),
        };
        let parts = RequestParts {
            method: req["method"].as_str().expect("method"),
            route: req["route"].as_str().expect("route"),
            headers: &header_refs,
            content_type: req["content_type"].as_str(),
            body: &body,
        };
        let got = fingerprint(&parts, &cfg);
        if let Some(err) = case.get("error") {
            let e = match got {
                Ok(f) => panic!("{name}: expected error {}, got {f}", err["code"]),
                Err(e) => e,
            };
            assert_eq!(e.code(), err["code"].as_str().expect("code"), "{name}: {e}");
            if let (Some(off), FingerprintError::Body(c)) = (err.get("offset"), &e) {
                assert_eq!(Some(c.offset as u64), off.as_u64(), "{name}");
                assert_eq!(c.pointer.as_deref(), err["pointer"].as_str(), "{name}");
            }
            rejected += 1;
            continue;
        }
        let f = got.unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = case["fingerprint"].as_str().expect("fingerprint");
        assert_eq!(f.to_string(), want, "{name}");
        assert_eq!(want.parse::<Fingerprint>().expect("parses"), f, "{name}");
        // The vector is self-consistent: SHA-256 of its framing is its v1 digest.
        let framing = hex(case["framing_hex"].as_str().expect("framing_hex"));
        if want.starts_with("v1:") {
            let digest: [u8; 32] = Sha256::digest(&framing).into();
            assert_eq!(f.digest(), &digest, "{name}: framing_hex");
        }
        // The canonical body matches the canonicalizer with the same exclusions and number mode.
        if let Some(canon) = case["canonical_body"].as_str() {
            let excl = Exclusions::new(&cfg.exclude).expect("pointers");
            let opts = CanonOptions {
                limits: cfg.limits,
                numbers: cfg.numbers,
            };
            let mut out = Vec::new();
            canonicalize_excluding_to(&body, &opts, &excl, &mut out).expect("canonical");
            assert_eq!(out, canon.as_bytes(), "{name}: canonical_body");
            assert!(
                framing
                    .windows(canon.len().max(1))
                    .any(|w| w == canon.as_bytes()),
                "{name}: canonical body is inside the framing"
            );
        }
        ok += 1;
    }
    assert!(ok >= 30 && rejected >= 5);
    println!("fingerprint vectors: {ok} digests and {rejected} rejections checked");
}
