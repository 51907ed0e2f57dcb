//! Per-call cost breakdown of one fingerprint: raw SHA-256 of the body, the framing and hashing
//! with the body taken as raw bytes (no JSON work), validation only, `canonicalize` into a
//! `Vec`, a kept `Canonicalizer` into a reused `Vec`, the full JSON fingerprint, and the JSON fingerprint of the body's canonical form. Figures are printed, never asserted.
//!
//! `cargo run --release -p idempo-benches --bin breakdown -- [body] [budget_ms]`
use std::hint::black_box;
use std::time::Duration;

use idempo_benches::time_per_call;
use idempo_core::canonical::{CanonOptions, Canonicalizer, NumberMode, canonicalize, validate};
use idempo_core::fingerprint::{FingerprintConfig, Fingerprinter, RequestParts};
use sha2::{Digest, Sha256};

fn main() {
    let mut args = std::env::args().skip(1);
    let only = args.next();
    let budget = args
        .next()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_millis(300), Duration::from_millis);
    let fp = match Fingerprinter::new(&FingerprintConfig::default()) {
        Ok(fp) => fp,
        Err(e) => {
            eprintln!("breakdown: {e}");
            std::process::exit(1);
        }
    };
    let strict = CanonOptions {
        numbers: NumberMode::RejectPrecisionLoss,
        ..CanonOptions::default()
    };
    println!(
        "{:<8} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "body",
        "bytes",
        "sha256",
        "fp raw",
        "validate",
        "canon",
        "canon kept",
        "fp json",
        "fp canon'd"
    );
    for (name, body) in idempo_benches::bodies() {
        if only.as_deref().is_some_and(|o| o != name && o != "all") {
            continue;
        }
        let json = RequestParts::json("POST", "/orders/{id}", &body);
        let raw = RequestParts {
            content_type: Some("application/octet-stream"),
            ..json
        };
        let t = |f: &mut dyn FnMut()| format!("{:.2?}", time_per_call(budget, f));
        let sha = t(&mut || {
            black_box(Sha256::digest(black_box(&body)));
        });
        let fraw = t(&mut || {
            black_box(fp.fingerprint(black_box(&raw)).ok());
        });
        let val = t(&mut || {
            black_box(validate(black_box(&body), &strict).ok());
        });
        let canon = t(&mut || {
            black_box(canonicalize(black_box(&body)).ok());
        });
        let mut kept = Canonicalizer::default();
        let mut out = Vec::new();
        let ckept = t(&mut || {
            out.clear();
            black_box(kept.canonicalize_into(black_box(&body), &mut out).ok());
        });
        let fjson = t(&mut || {
            black_box(fp.fingerprint(black_box(&json)).ok());
        });
        // The same body already canonical: the fingerprint then costs framing, hashing and
        // a validating parse whose output is one copied run.
        let canonical = canonicalize(&body).unwrap_or_default();
        let pre = RequestParts::json("POST", "/orders/{id}", &canonical);
        let fpre = t(&mut || {
            black_box(fp.fingerprint(black_box(&pre)).ok());
        });
        println!(
            "{:<8} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
            name,
            body.len(),
            sha,
            fraw,
            val,
            canon,
            ckept,
            fjson,
            fpre
        );
    }
}
