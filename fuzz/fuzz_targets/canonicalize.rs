//! Fuzz `idempo_core::canonical` with arbitrary bytes: no panic, no stack overflow, and every
//! accepted input yields output that is a fixed point, identical through every sink, and
//! accepted again in both number modes (the shortest ES6 form is always exact). The small-
//! document fast path (taken without exclusions) must agree with the full parser (taken with
//! any exclusion) byte for byte, errors included.
#![no_main]

use idempo_core::canonical::{
    CanonError, CanonOptions, DigestSink, Exclusions, Limits, NumberMode,
    canonicalize_excluding_to, canonicalize_to, canonicalize_with,
};
use idempo_core::fingerprint::{FingerprintConfig, Fingerprinter, RequestParts};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

fn check_error(e: &CanonError, len: usize) {
    assert!(!e.code().is_empty());
    assert!(e.offset <= len, "offset {} beyond input {len}", e.offset);
}

fuzz_target!(|data: &[u8]| {
    let rfc = CanonOptions {
        limits: Limits {
            max_depth: 4096,
            ..Limits::default()
        },
        numbers: NumberMode::Rfc,
    };
    let strict = CanonOptions {
        numbers: NumberMode::RejectPrecisionLoss,
        ..rfc
    };
    match canonicalize_with(data, &rfc) {
        Ok(out) => {
            let again = canonicalize_with(&out, &rfc).expect("canonical output re-parses");
            assert_eq!(again, out, "canonical output is a fixed point");
            let strict_again = canonicalize_with(&out, &strict).expect("ES6 numbers are exact");
            assert_eq!(strict_again, out);
            let mut sink = DigestSink::new(Sha256::new());
            canonicalize_to(data, &rfc, &mut sink).expect("same input, same result");
            let (h, n) = sink.finish();
            assert_eq!(n as usize, out.len());
            assert_eq!(h.finalize(), Sha256::digest(&out));
        }
        Err(e) => check_error(&e, data.len()),
    }
    if let Err(e) = canonicalize_with(data, &strict) {
        check_error(&e, data.len());
    }
    // An exclusion no document here names sends the same input through the full parser.
    let never = Exclusions::new(["/\u{10FFFF}idempo-fuzz-never"]).expect("valid pointer");
    for opts in [&rfc, &strict] {
        let mut full = Vec::new();
        let full = canonicalize_excluding_to(data, opts, &never, &mut full).map(|()| full);
        match (canonicalize_with(data, opts), full) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "fast path and full parser differ"),
            (Err(a), Err(b)) => assert_eq!((a.code(), a.offset), (b.code(), b.offset)),
            (a, b) => panic!("fast path {a:?} vs full parser {b:?}"),
        }
    }
    if let Ok(fp) = Fingerprinter::new(&FingerprintConfig {
        exclude: vec!["/a".into(), "/b/0".into()],
        ..FingerprintConfig::default()
    }) {
        let _ = fp.fingerprint(&RequestParts::json("POST", "/fuzz", data));
    }
});
