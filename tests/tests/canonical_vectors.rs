//! The project's own canonical-JSON vectors (`spec/vectors/canonical/*.json`, format in
//! `spec/vectors/README.md`): every case must give exactly the expected bytes or the expected
//! error code, byte offset and JSON pointer.

use std::fs;

use idempo_core::canonical::{
    CanonOptions, Exclusions, Limits, NumberMode, canonicalize_excluding_to,
};
use serde_json::Value;

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn options(case: &Value) -> CanonOptions {
    let numbers = match case["mode"].as_str().expect("mode") {
        "rfc" => NumberMode::Rfc,
        "reject_precision_loss" => NumberMode::RejectPrecisionLoss,
        other => panic!("unknown mode {other}"),
    };
    let mut limits = Limits::default();
    if let Some(l) = case.get("limits") {
        let get = |k: &str| l.get(k).and_then(Value::as_u64).map(|v| v as usize);
        if let Some(v) = get("max_input_bytes") {
            limits.max_input_bytes = v;
        }
        if let Some(v) = get("max_depth") {
            limits.max_depth = v;
        }
        if let Some(v) = get("max_members") {
            limits.max_members = v;
        }
    }
    CanonOptions { limits, numbers }
}

#[test]
fn canonical_vectors() {
    let dir = idempo_tests::vectors_dir("canonical");
    let mut files: Vec<_> = fs::read_dir(&dir)
        .expect("spec/vectors/canonical exists")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "vector files present");
    let (mut ok, mut rejected) = (0, 0);
    let mut codes = std::collections::BTreeSet::new();
    let mut failures: Vec<String> = Vec::new();
    for file in files {
        let doc: Value =
            serde_json::from_slice(&fs::read(&file).expect("read")).expect("vector file is JSON");
        assert_eq!(doc["format"], "idempo-canonical-vectors/1");
        for case in doc["cases"].as_array().expect("cases") {
            let name = format!(
                "{}:{}",
                file.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
                case["name"].as_str().expect("name")
            );
            let input = match (case.get("input"), case.get("input_hex")) {
                (Some(Value::String(s)), None) => s.as_bytes().to_vec(),
                (None, Some(Value::String(h))) => hex(h),
                _ => panic!("{name}: exactly one of input / input_hex"),
            };
            let excl = match case.get("exclude") {
                Some(Value::Array(a)) => {
                    Exclusions::new(a.iter().map(|p| p.as_str().expect("pointer")))
                        .expect("valid pointers")
                }
                _ => Exclusions::none(),
            };
            let mut out = Vec::new();
            let res = canonicalize_excluding_to(&input, &options(case), &excl, &mut out);
            match (case.get("output"), case.get("error")) {
                (Some(Value::String(want)), None) => match res {
                    Err(e) => failures.push(format!("{name}: expected output, got error {e}")),
                    Ok(()) if out != want.as_bytes() => failures.push(format!(
                        "{name}: expected {want:?}, got {:?}",
                        String::from_utf8_lossy(&out)
                    )),
                    Ok(()) => ok += 1,
                },
                (None, Some(err)) => {
                    let want = (
                        err["code"].as_str().expect("code"),
                        err["offset"].as_u64().expect("offset"),
                        err["pointer"].as_str(),
                    );
                    match res {
                        Ok(()) => failures.push(format!(
                            "{name}: expected {want:?}, got output {:?}",
                            String::from_utf8_lossy(&out)
                        )),
                        Err(e) => {
                            let got = (e.code(), e.offset as u64, e.pointer.as_deref());
                            if got == want {
                                codes.insert(e.code());
                                rejected += 1;
                            } else {
                                failures.push(format!("{name}: expected {want:?}, got {got:?}"));
                            }
                        }
                    }
                }
                _ => panic!("{name}: exactly one of output / error"),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing vectors:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Every rejection category of the profile is exercised.
    for code in [
        "invalid_utf8",
        "byte_order_mark",
        "lone_surrogate",
        "duplicate_member",
        "non_finite_number",
        "number_out_of_range",
        "trailing_data",
        "leading_zero",
        "invalid_number",
        "comment",
        "trailing_comma",
        "invalid_whitespace",
        "control_character",
        "invalid_escape",
        "invalid_literal",
        "unexpected_character",
        "unexpected_end",
        "depth_limit",
        "too_many_members",
        "input_too_large",
        "precision_loss",
    ] {
        assert!(codes.contains(code), "no vector rejects with {code}");
    }
    assert!(ok + rejected >= 500, "hundreds of cases");
    println!("canonical vectors: {ok} outputs and {rejected} rejections checked");
}
