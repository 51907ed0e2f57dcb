//! Fuzz `Idempotency-Key` parsing with arbitrary bytes: no panic; an accepted key is printable
//! ASCII within the configured length, and its client header value parses back to the same key
//! in strict mode; a refusal carries a stable code, an offset inside the input and a message made
//! of printable ASCII only (raw input is never echoed). The first byte picks the options.
#![no_main]

use idempo_core::key::{IdempotencyKey, KeyForm, KeyOptions, parse_key_detailed};
use idempo_core::scope::ScopeId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (selector, value) = match data.split_first() {
        Some((s, rest)) => (*s, rest),
        None => (0, data),
    };
    let min = usize::from(selector & 0x0f) + 1;
    let max = if selector & 0x10 != 0 { 255 } else { 128 };
    let opts = KeyOptions::new(min, max)
        .expect("valid options")
        .with_strict(selector & 0x20 != 0);
    match parse_key_detailed(value, &opts) {
        Ok(parsed) => {
            let key = &parsed.key;
            assert!((min..=max).contains(&key.len()));
            assert!(key.as_str().bytes().all(|b| (0x20..=0x7e).contains(&b)));
            assert!(!(opts.is_strict() && parsed.form == KeyForm::Bare));
            let header = key.to_header_value();
            let again = parse_key_detailed(header.as_bytes(), &opts.with_strict(true))
                .expect("own header value");
            assert_eq!(&again.key, key);
            assert_eq!(again.ignored_parameters, 0);
            let text =
                IdempotencyKey::from_text(key.as_str(), &opts).expect("decoded text is valid");
            assert_eq!(&text, key);
            let id = ScopeId::new("p", "POST", "/r", key);
            assert_eq!(id.to_hex().parse::<ScopeId>(), Ok(id));
        }
        Err(e) => {
            assert!(!e.code().is_empty());
            if let Some(offset) = e.offset() {
                assert!(
                    offset <= value.len(),
                    "offset {offset} outside input of {}",
                    value.len()
                );
            }
            let message = e.to_string();
            assert!(
                message.bytes().all(|b| (0x20..=0x7e).contains(&b)),
                "message echoes raw bytes"
            );
        }
    }
});
