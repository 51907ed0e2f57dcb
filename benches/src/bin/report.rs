//! Summary report: MB/s of raw SHA-256 (the limit), `canonicalize` and `fingerprint` for each
//! benchmark body, and the fingerprint's share of the SHA-256 throughput. Figures are printed,
//! never asserted. Run: `cargo run --release -p idempo-benches --bin report [budget_ms]`.
use std::time::Duration;

fn main() {
    let budget = std::env::args()
        .nth(1)
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_millis(600), Duration::from_millis);
    if let Err(e) = idempo_benches::print_report(budget) {
        eprintln!("report: {e}");
        std::process::exit(1);
    }
}
