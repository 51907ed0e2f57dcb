//! Rust side of `make bench-peers`: for every body file in the directory given as the first
//! argument, times idempo's fingerprint, idempo's canonicalize + SHA-256, `serde_jcs` (parse into
//! `serde_json::Value`, serialize with JCS) + SHA-256, and raw SHA-256 of the body (the limit).
//! Prints one JSON line per measurement (nanoseconds per operation, best of five interleaved rounds); the
//! Python driver merges them into one table. Figures only, nothing asserted.
use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use idempo_core::canonical::canonicalize;
use idempo_core::fingerprint::{FingerprintConfig, Fingerprinter, RequestParts};
use sha2::{Digest, Sha256};

/// Best-of-five nanoseconds per call of each case, the rounds interleaved (round r runs every
/// case for about `budget / 5`), so a load change on the machine skews all of them alike. A case
/// whose first call returns `false` (it refused the body) gets no figure.
fn time_all(budget: Duration, cases: &mut [(&str, &mut dyn FnMut() -> bool)]) -> Vec<Option<f64>> {
    let mut best: Vec<Option<f64>> = cases
        .iter_mut()
        .map(|(_, f)| f().then_some(f64::INFINITY))
        .collect();
    let round = budget / 5;
    for _ in 0..5 {
        for ((_, f), slot) in cases.iter_mut().zip(best.iter_mut()) {
            let Some(current) = *slot else { continue };
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < round || n == 0 {
                black_box(f());
                n += 1;
            }
            *slot = Some(current.min(start.elapsed().as_nanos() as f64 / n as f64));
        }
    }
    best
}

fn emit(body: &str, imp: &str, ns: Option<f64>) {
    match ns {
        Some(ns) => println!(r#"{{"lang":"rust","impl":"{imp}","body":"{body}","ns":{ns:.1}}}"#),
        None => println!(r#"{{"lang":"rust","impl":"{imp}","body":"{body}","ns":null}}"#),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: idempo-evidence-peers <bodies-dir> [budget_ms]");
        std::process::exit(2);
    };
    let budget = Duration::from_millis(args.next().and_then(|s| s.parse().ok()).unwrap_or(500));
    let mut files: Vec<_> = match std::fs::read_dir(Path::new(&dir)) {
        Ok(rd) => rd.filter_map(Result::ok).map(|e| e.path()).collect(),
        Err(e) => {
            eprintln!("cannot read {dir}: {e}");
            std::process::exit(1);
        }
    };
    files.sort();
    let fp = match Fingerprinter::new(&FingerprintConfig::default()) {
        Ok(fp) => fp,
        Err(e) => {
            eprintln!("fingerprinter: {e}");
            std::process::exit(1);
        }
    };
    for path in files {
        let Some(name) = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned) else {
            continue;
        };
        let body = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("cannot read {}: {e}", path.display());
                std::process::exit(1);
            }
        };
        let parts = RequestParts::json("POST", "/payments", &body);
        let mut fingerprint = || fp.fingerprint(&parts).is_ok();
        let mut canonical = || match canonicalize(&body) {
            Ok(out) => {
                black_box(Sha256::digest(&out));
                true
            }
            Err(_) => false,
        };
        let mut jcs = || match serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| serde_jcs::to_vec(&v).ok())
        {
            Some(out) => {
                black_box(Sha256::digest(&out));
                true
            }
            None => false,
        };
        let mut raw = || {
            black_box(Sha256::digest(&body));
            true
        };
        let mut cases: [(&str, &mut dyn FnMut() -> bool); 4] = [
            ("idempo fingerprint", &mut fingerprint),
            ("idempo canonicalize+sha256", &mut canonical),
            ("serde_jcs+sha256", &mut jcs),
            ("raw sha256 (limit)", &mut raw),
        ];
        let figures = time_all(budget, &mut cases);
        for ((imp, _), ns) in cases.iter().zip(figures) {
            emit(&name, imp, ns);
        }
    }
}
