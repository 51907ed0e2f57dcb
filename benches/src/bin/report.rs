//! Summary report: for each benchmark body, the throughput of raw SHA-256 over the body bytes (the
//! limit), of `canonicalize` and of `fingerprint`, in MB/s, and the fingerprint's ratio to the
//! limit. Figures are printed, never asserted. Run: `cargo run --release -p idempo-benches --bin report`.
use std::hint::black_box;
use std::time::Duration;

use idempo_benches::{bodies, time_per_call};
use idempo_core::canonical::canonicalize;
use idempo_core::fingerprint::{FingerprintConfig, Fingerprinter, RequestParts};
use sha2::{Digest, Sha256};

fn main() {
    let budget = std::env::args()
        .nth(1)
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_millis(600), Duration::from_millis);
    let fp = match Fingerprinter::new(&FingerprintConfig::default()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("config: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "{:<8} {:>9} {:>12} {:>12} {:>12} {:>12} {:>10}",
        "body", "bytes", "sha256 MB/s", "canon MB/s", "fp MB/s", "fp time", "fp/sha256"
    );
    for (name, body) in bodies() {
        let mb = body.len() as f64 / 1e6;
        let sha = time_per_call(budget, || {
            black_box(Sha256::digest(black_box(&body)));
        });
        let canon = time_per_call(budget, || {
            black_box(canonicalize(black_box(&body)).ok());
        });
        let parts = RequestParts::json("POST", "/orders/{id}", &body);
        if let Err(e) = fp.fingerprint(&parts) {
            eprintln!("{name}: {e}");
            std::process::exit(1);
        }
        let fpt = time_per_call(budget, || {
            black_box(fp.fingerprint(black_box(&parts)).ok());
        });
        let rate = |d: Duration| mb / d.as_secs_f64();
        println!(
            "{:<8} {:>9} {:>12.0} {:>12.0} {:>12.0} {:>12} {:>9.1}%",
            name,
            body.len(),
            rate(sha),
            rate(canon),
            rate(fpt),
            format!("{:.2?}", fpt),
            100.0 * sha.as_secs_f64() / fpt.as_secs_f64()
        );
    }
}
