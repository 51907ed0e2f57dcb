//! Profiling driver for core's bounded in-memory store: `prefill` records, then `ops` fresh
//! keys each claimed and completed, as one fresh request does. Prints ns per request; run it
//! under `valgrind --tool=cachegrind` for instruction and cache-miss counts. Nothing asserted.
//!
//! `cargo run --release -p idempo-benches --bin memstore -- [prefill] [ops]`
use std::hint::black_box;
use std::time::Instant;

use idempo_core::machine::memory::{MemoryLimits, MemoryStore, Partition};
use idempo_core::record::{FencingToken, FingerprintText, StoredResponse};
use idempo_core::scope::ScopeId;

fn main() {
    let mut args = std::env::args().skip(1);
    let prefill: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let ops: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let mut store = MemoryStore::new(MemoryLimits::new(usize::MAX / 2, usize::MAX / 2));
    let fp =
        FingerprintText::new("v1:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
            .expect("fingerprint");
    let part = Some(Partition::of_principal("bench"));
    let response = StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: br#"{"id":"pay_1","status":"succeeded","amount":12345}"#.to_vec(),
    };
    let mut now = 1_000_000_u64;
    let run = |i: u32, now: u64, store: &mut MemoryStore| {
        let scope = ScopeId::from_parts("bench", "POST", "/pay", &i.to_string());
        let token = FencingToken([(i & 0xff) as u8; 16]);
        let claimed = store.claim(scope, part, &fp, token, 30_000, 86_400_000, now);
        black_box(&claimed);
        let done = store.complete(scope, token, response.clone(), 86_400_000, now);
        black_box(&done);
    };
    for i in 0..prefill {
        run(i, now, &mut store);
        now += 1;
    }
    let start = Instant::now();
    for i in prefill..prefill + ops {
        run(i, now, &mut store);
        now += 1;
    }
    let el = start.elapsed();
    println!(
        "memstore: {prefill} prefilled, {ops} fresh claims + completions: {:.0} ns per request, {} records",
        el.as_nanos() as f64 / f64::from(ops),
        store.len()
    );
}
