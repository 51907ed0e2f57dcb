//! Property tests for `Idempotency-Key` parsing and formatting.
use idempo_core::key::{
    IdempotencyKey, KeyForm, KeyOptions, parse_key, parse_key_bytes, parse_key_detailed,
};
use proptest::prelude::*;

fn wide() -> KeyOptions {
    KeyOptions::new(1, 255).expect("options")
}

/// Key text: printable ASCII, space included.
fn key_text(min: usize, max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(0x20u8..=0x7e, min..=max)
        .prop_map(|v| String::from_utf8(v).expect("ascii"))
}

/// Bare-form text: `%x21-7E` minus `"` and `,`.
fn bare_text(min: usize, max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(
        (0x21u8..=0x7e).prop_filter("bare", |b| *b != b'"' && *b != b','),
        min..=max,
    )
    .prop_map(|v| String::from_utf8(v).expect("ascii"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Any key text formats to a header value that parses back (in strict mode) to the same key.
    #[test]
    fn format_parse_round_trip(text in key_text(1, 255)) {
        let key = IdempotencyKey::from_text(&text, &wide()).expect("valid text");
        let hv = key.to_header_value();
        let strict = wide().with_strict(true);
        let parsed = parse_key_detailed(hv.as_bytes(), &strict).expect("own header value parses");
        prop_assert_eq!(parsed.form, KeyForm::SfString);
        prop_assert_eq!(parsed.key.as_str(), text.as_str());
    }

    /// The bare form is the key itself, and it survives surrounding whitespace.
    #[test]
    fn bare_is_identity(text in bare_text(8, 128), lead in "[ \t]{0,3}", trail in "[ \t]{0,3}") {
        let v = format!("{lead}{text}{trail}");
        let key = parse_key(&v, &KeyOptions::default()).expect("bare key");
        prop_assert_eq!(key.as_str(), text.as_str());
        // Strict mode refuses exactly this.
        let strict = KeyOptions::default().with_strict(true);
        prop_assert_eq!(parse_key(&v, &strict).map_err(|e| e.code()), Err("bare_form_not_allowed"));
    }

    /// Arbitrary bytes never panic; accepted keys are printable ASCII within bounds and stable
    /// under format-then-parse; error messages are printable ASCII (no raw bytes echoed).
    #[test]
    fn arbitrary_bytes(input in proptest::collection::vec(any::<u8>(), 0..300), strict in any::<bool>()) {
        let opts = KeyOptions::default().with_strict(strict);
        match parse_key_bytes(&input, &opts) {
            Ok(key) => {
                prop_assert!(key.len() >= 8 && key.len() <= 128);
                prop_assert!(key.as_str().bytes().all(|b| (0x20..=0x7e).contains(&b)));
                let again = parse_key(&key.to_header_value(), &opts).expect("reparse");
                prop_assert_eq!(again, key);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{:?}", msg);
                prop_assert!(msg.len() < 400);
                if let Some(off) = e.offset() {
                    prop_assert!(off <= input.len());
                }
            }
        }
    }

    /// Structured-looking inputs: quoted strings with random escapes and parameters.
    #[test]
    fn sf_like_inputs(body in "[ -~]{0,40}", params in "(;[a-z*][a-z0-9_.*-]{0,4}(=([0-9]{1,4}|\\?[01]|[a-z]{1,4}|\"[a-z ]{0,4}\"))?){0,3}") {
        let v = format!("\"{body}\"{params}");
        if let Ok(p) = parse_key_detailed(v.as_bytes(), &wide()) {
            prop_assert_eq!(p.form, KeyForm::SfString);
            let reparsed = parse_key(&p.key.to_header_value(), &wide()).expect("reparse");
            prop_assert_eq!(reparsed, p.key);
        }
    }

    /// Generated keys are 36-character UUIDv4 shapes and valid in strict mode.
    #[test]
    fn generated_keys_are_valid(entropy in any::<[u8; 16]>()) {
        let key = IdempotencyKey::generate(entropy);
        let s = key.as_str().as_bytes();
        prop_assert_eq!(s.len(), 36);
        prop_assert_eq!(s[14], b'4');
        prop_assert!(matches!(s[19], b'8' | b'9' | b'a' | b'b'));
        let strict = KeyOptions::default().with_strict(true);
        prop_assert_eq!(parse_key(&key.to_header_value(), &strict).expect("valid"), key);
    }
}
