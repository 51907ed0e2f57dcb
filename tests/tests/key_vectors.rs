//! Runs `spec/vectors/key/*.json` (format: spec/vectors/README.md, "Key vectors").
use idempo_core::key::{IdempotencyKey, KeyOptions, parse_key_detailed};
use idempo_tests::vectors_dir;
use serde_json::Value;

fn load(name: &str) -> Value {
    let path = vectors_dir("key").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn hex_bytes(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn options(v: &Value) -> KeyOptions {
    let n = |k: &str| usize::try_from(v[k].as_u64().expect(k)).expect("fits");
    KeyOptions::new(n("min_len"), n("max_len"))
        .expect("vector options are valid")
        .with_strict(v["strict"].as_bool().expect("strict"))
}

#[test]
fn parse_vectors() {
    let doc = load("parse.json");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(
        cases.len() >= 60,
        "expected the full vector set, got {}",
        cases.len()
    );
    let (mut ok, mut err) = (0, 0);
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let input = match (case["input"].as_str(), case["input_hex"].as_str()) {
            (Some(s), None) => s.as_bytes().to_vec(),
            (None, Some(h)) => hex_bytes(h),
            _ => panic!("{name}: exactly one of input / input_hex"),
        };
        let opts = options(&case["options"]);
        let expect = &case["expect"];
        let got = parse_key_detailed(&input, &opts);
        if let Some(code) = expect["error"].as_str() {
            let e = got
                .err()
                .unwrap_or_else(|| panic!("{name}: expected error {code}"));
            assert_eq!(e.code(), code, "{name}: {e}");
            if let Some(off) = expect.get("offset") {
                assert_eq!(
                    e.offset(),
                    Some(usize::try_from(off.as_u64().expect("offset")).expect("fits")),
                    "{name}"
                );
            }
            let msg = e.to_string();
            assert!(
                msg.bytes().all(|b| (0x20..0x7f).contains(&b)),
                "{name}: message not printable ASCII: {msg:?}"
            );
            err += 1;
        } else {
            let p = got.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                p.key.as_str(),
                expect["key"].as_str().expect("key"),
                "{name}"
            );
            assert_eq!(
                p.form.as_str(),
                expect["form"].as_str().expect("form"),
                "{name}"
            );
            assert_eq!(
                p.ignored_parameters as u64,
                expect["ignored_parameters"].as_u64().expect("n"),
                "{name}"
            );
            let hv = p.key.to_header_value();
            assert_eq!(
                hv,
                expect["header_value"].as_str().expect("header_value"),
                "{name}"
            );
            // The header value parses back to the same key, also in strict mode.
            let again = IdempotencyKey::parse(&hv, &opts.with_strict(true)).expect("round trip");
            assert_eq!(again, p.key, "{name}");
            ok += 1;
        }
    }
    println!("key vectors: {ok} valid, {err} invalid");
}

#[test]
fn option_vectors() {
    let doc = load("options.json");
    for case in doc["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let n = |k: &str| usize::try_from(case[k].as_u64().expect(k)).expect("fits");
        let got = KeyOptions::new(n("min_len"), n("max_len"));
        match case["expect"].as_str().expect("expect") {
            "ok" => assert!(got.is_ok(), "{name}: {got:?}"),
            code => assert_eq!(got.expect_err(name).code(), code, "{name}"),
        }
    }
}

#[test]
fn generate_vectors() {
    let doc = load("generate.json");
    for case in doc["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let entropy: [u8; 16] = hex_bytes(case["entropy_hex"].as_str().expect("hex"))
            .try_into()
            .expect("16 bytes");
        let key = IdempotencyKey::generate(entropy);
        assert_eq!(key.as_str(), case["key"].as_str().expect("key"), "{name}");
        let strict = KeyOptions::default().with_strict(true);
        assert_eq!(
            IdempotencyKey::parse(&key.to_header_value(), &strict).as_ref(),
            Ok(&key),
            "{name}"
        );
    }
}
