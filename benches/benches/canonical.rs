//! Criterion benches: canonicalize and fingerprint on each body, plus raw SHA-256 of the same bytes
//! (the limit). `cargo bench -p idempo-benches`; for the MB/s table with ratios run the `report`
//! binary (also printed at the end of this bench).
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group};
use idempo_benches::bodies;
use idempo_core::canonical::canonicalize;
use idempo_core::fingerprint::{FingerprintConfig, Fingerprinter, RequestParts};
use sha2::{Digest, Sha256};

fn bench(c: &mut Criterion) {
    let fp = Fingerprinter::new(&FingerprintConfig::default()).expect("default config is valid");
    for (name, body) in bodies() {
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Bytes(body.len() as u64));
        if body.len() > 100_000 {
            g.sample_size(20);
        }
        g.bench_function("sha256", |b| b.iter(|| Sha256::digest(black_box(&body))));
        g.bench_function("canonicalize", |b| {
            b.iter(|| canonicalize(black_box(&body)).expect("valid body"));
        });
        let parts = RequestParts::json("POST", "/orders/{id}", &body);
        g.bench_function("fingerprint", |b| {
            b.iter(|| fp.fingerprint(black_box(&parts)).expect("valid body"));
        });
        g.finish();
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    println!("\nsummary (MB/s; fp/sha256 = fingerprint throughput as a share of raw SHA-256):");
    if let Err(e) = idempo_benches::print_report(std::time::Duration::from_millis(500)) {
        eprintln!("report: {e}");
    }
}
