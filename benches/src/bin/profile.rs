//! Profiling driver: run one operation on one benchmark body a fixed number of times, so that an
//! instruction-counting profiler (`valgrind --tool=callgrind`) gives stable per-call figures on a
//! shared machine. Prints the body size and the iteration count; nothing is asserted.
//!
//! `cargo run --release -p idempo-benches --bin profile -- <body> <canon|fp|fpc|fpraw|sha> [iterations]`
//! (`fpc`: the fingerprint of the body's canonical form; `fpraw`: of the body as raw bytes).
use std::hint::black_box;

use idempo_core::canonical::canonicalize;
use idempo_core::fingerprint::{FingerprintConfig, Fingerprinter, RequestParts};
use sha2::{Digest, Sha256};

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "large".into());
    let op = args.next().unwrap_or_else(|| "fp".into());
    let iters: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let Some((_, body)) = idempo_benches::bodies()
        .into_iter()
        .find(|(n, _)| *n == name)
    else {
        eprintln!(
            "profile: unknown body {name:?} (tiny, medium, large, numbers, unicode, uni-raw, uni-esc)"
        );
        std::process::exit(2);
    };
    let fp = match Fingerprinter::new(&FingerprintConfig::default()) {
        Ok(fp) => fp,
        Err(e) => {
            eprintln!("profile: {e}");
            std::process::exit(1);
        }
    };
    let canonical = canonicalize(&body).unwrap_or_default();
    let mut parts = RequestParts::json(
        "POST",
        "/orders/{id}",
        if op == "fpc" { &canonical } else { &body },
    );
    if op == "fpraw" {
        parts.content_type = Some("application/octet-stream");
    }
    for _ in 0..iters {
        match op.as_str() {
            "canon" => {
                black_box(canonicalize(black_box(&body)).ok());
            }
            "sha" => {
                black_box(Sha256::digest(black_box(&body)));
            }
            _ => {
                black_box(fp.fingerprint(black_box(&parts)).ok());
            }
        }
    }
    println!("{name}: {} bytes, {op} x {iters}", body.len());
}
