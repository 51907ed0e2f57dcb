//! The request-path metrics of `spec/METRICS.md`, exported as Prometheus text on `/metrics`.
//!
//! Labels are the route template, core's outcome name and core's primitive name
//! ([`StoreOp::name`](idempo_core::machine::StoreOp::name)); never a key, body, fingerprint or
//! principal. Histogram bounds are core's [`STORE_LATENCY_BUCKETS_SECONDS`].
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use idempo_core::metrics::STORE_LATENCY_BUCKETS_SECONDS;

use crate::store::sqlite::BatchStats;

/// `idempo_requests_total{route,outcome}`.
pub const REQUESTS: &str = "idempo_requests_total";
/// `idempo_lease_lost_total{route}`.
pub const LEASE_LOST: &str = "idempo_lease_lost_total";
/// `idempo_takeovers_total{route}`.
pub const TAKEOVERS: &str = "idempo_takeovers_total";
/// `idempo_store_errors_total{route,op}`.
pub const STORE_ERRORS: &str = "idempo_store_errors_total";
/// `idempo_store_operation_duration_seconds{op}`.
pub const STORE_LATENCY: &str = "idempo_store_operation_duration_seconds";
/// `idempo_gateway_sqlite_batch_size`: the gateway's own series (not in `spec/METRICS.md`), the
/// write primitives each transaction of the SQLite store's group commit carried.
pub const SQLITE_BATCH_SIZE: &str = "idempo_gateway_sqlite_batch_size";
/// `idempo_gateway_jwks_reloads_total{result}`: the gateway's own series, each read of a changed
/// JWKS file (`result="loaded"`, or `"failed"` when the file could not be used and the previous
/// keys stayed). Exported when the principal is a verified JWT.
pub const JWKS_RELOADS: &str = "idempo_gateway_jwks_reloads_total";

#[derive(Default, Debug)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

#[derive(Default, Debug)]
struct Inner {
    /// By route, then outcome (nested, so counting looks up borrowed names, allocating only on a
    /// pair's first request).
    requests: BTreeMap<String, BTreeMap<String, u64>>,
    lease_lost: BTreeMap<String, u64>,
    takeovers: BTreeMap<String, u64>,
    store_errors: BTreeMap<(String, String), u64>,
    latency: BTreeMap<String, Histogram>,
}

/// The gateway's metric registry.
#[derive(Default, Debug)]
pub struct Metrics {
    inner: Mutex<Inner>,
    sqlite_batches: OnceLock<Arc<BatchStats>>,
    jwks: AtomicBool,
    jwks_loaded: AtomicU64,
    jwks_failed: AtomicU64,
}

impl Metrics {
    fn with(&self, f: impl FnOnce(&mut Inner)) {
        let mut g = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut g);
    }

    /// One answered protected request.
    pub fn request(&self, route: &str, outcome: &str) {
        self.with(|i| {
            let by_outcome = match i.requests.get_mut(route) {
                Some(m) => m,
                None => i.requests.entry(route.to_owned()).or_default(),
            };
            match by_outcome.get_mut(outcome) {
                Some(c) => *c += 1,
                None => {
                    by_outcome.insert(outcome.to_owned(), 1);
                }
            }
        });
    }

    /// A handler whose lease was taken over while it ran.
    pub fn lease_lost(&self, route: &str) {
        self.with(|i| *i.lease_lost.entry(route.to_owned()).or_default() += 1);
    }

    /// A takeover that re-runs the upstream.
    pub fn takeover(&self, route: &str) {
        self.with(|i| *i.takeovers.entry(route.to_owned()).or_default() += 1);
    }

    /// A store primitive that failed.
    pub fn store_error(&self, route: &str, op: &str) {
        self.with(|i| {
            *i.store_errors
                .entry((route.to_owned(), op.to_owned()))
                .or_default() += 1;
        });
    }

    /// A store primitive's duration.
    pub fn store_latency(&self, op: &str, seconds: f64) {
        self.with(|i| {
            let h = match i.latency.get_mut(op) {
                Some(h) => h,
                None => i.latency.entry(op.to_owned()).or_insert_with(|| Histogram {
                    counts: vec![0; STORE_LATENCY_BUCKETS_SECONDS.len()],
                    ..Histogram::default()
                }),
            };
            for (c, bound) in h.counts.iter_mut().zip(STORE_LATENCY_BUCKETS_SECONDS) {
                if seconds <= *bound {
                    *c += 1;
                }
            }
            h.sum += seconds;
            h.count += 1;
        });
    }

    /// Exports the SQLite store's batch sizes as [`SQLITE_BATCH_SIZE`] (once; later calls are
    /// ignored).
    pub fn attach_sqlite_batches(&self, stats: Arc<BatchStats>) {
        let _ = self.sqlite_batches.set(stats);
    }

    /// Exports [`JWKS_RELOADS`] (the principal is a verified JWT).
    pub fn attach_jwks(&self) {
        self.jwks.store(true, Ordering::Relaxed);
    }

    /// One read of a changed JWKS file: its keys `loaded`, or refused.
    pub fn jwks_reload(&self, loaded: bool) {
        let c = if loaded {
            &self.jwks_loaded
        } else {
            &self.jwks_failed
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = String::new();
        if self.jwks.load(Ordering::Relaxed) {
            let _ = writeln!(out, "# TYPE {JWKS_RELOADS} counter");
            for (result, c) in [("loaded", &self.jwks_loaded), ("failed", &self.jwks_failed)] {
                let v = c.load(Ordering::Relaxed);
                let _ = writeln!(out, "{JWKS_RELOADS}{{result=\"{result}\"}} {v}");
            }
        }
        if let Some(b) = self.sqlite_batches.get() {
            let _ = writeln!(out, "# TYPE {SQLITE_BATCH_SIZE} histogram");
            for (bound, c) in b.buckets() {
                let _ = writeln!(out, "{SQLITE_BATCH_SIZE}_bucket{{le=\"{bound}\"}} {c}");
            }
            let count = b.transactions();
            let _ = writeln!(out, "{SQLITE_BATCH_SIZE}_bucket{{le=\"+Inf\"}} {count}");
            let _ = writeln!(out, "{SQLITE_BATCH_SIZE}_sum {}", b.ops());
            let _ = writeln!(out, "{SQLITE_BATCH_SIZE}_count {count}");
        }
        self.with(|i| {
            let _ = writeln!(out, "# TYPE {REQUESTS} counter");
            let pairs = i
                .requests
                .iter()
                .flat_map(|(route, m)| m.iter().map(move |(outcome, v)| (route, outcome, v)));
            for (route, outcome, v) in pairs {
                let _ = writeln!(
                    out,
                    "{REQUESTS}{{route=\"{}\",outcome=\"{}\"}} {v}",
                    esc(route),
                    esc(outcome)
                );
            }
            for (name, map) in [(LEASE_LOST, &i.lease_lost), (TAKEOVERS, &i.takeovers)] {
                let _ = writeln!(out, "# TYPE {name} counter");
                for (route, v) in map {
                    let _ = writeln!(out, "{name}{{route=\"{}\"}} {v}", esc(route));
                }
            }
            let _ = writeln!(out, "# TYPE {STORE_ERRORS} counter");
            for ((route, op), v) in &i.store_errors {
                let _ = writeln!(
                    out,
                    "{STORE_ERRORS}{{route=\"{}\",op=\"{}\"}} {v}",
                    esc(route),
                    esc(op)
                );
            }
            let _ = writeln!(out, "# TYPE {STORE_LATENCY} histogram");
            for (op, h) in &i.latency {
                for (c, bound) in h.counts.iter().zip(STORE_LATENCY_BUCKETS_SECONDS) {
                    let _ = writeln!(
                        out,
                        "{STORE_LATENCY}_bucket{{op=\"{}\",le=\"{bound}\"}} {c}",
                        esc(op)
                    );
                }
                let _ = writeln!(
                    out,
                    "{STORE_LATENCY}_bucket{{op=\"{}\",le=\"+Inf\"}} {}",
                    esc(op),
                    h.count
                );
                let _ = writeln!(out, "{STORE_LATENCY}_sum{{op=\"{}\"}} {}", esc(op), h.sum);
                let _ = writeln!(
                    out,
                    "{STORE_LATENCY}_count{{op=\"{}\"}} {}",
                    esc(op),
                    h.count
                );
            }
        });
        out
    }
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_vectors() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../../spec/vectors/metrics/request.json"))
                .expect("JSON");
        let want: Vec<&str> = doc["metrics"]
            .as_array()
            .expect("metrics")
            .iter()
            .map(|m| m["prometheus"].as_str().expect("name"))
            .collect();
        assert_eq!(
            want,
            [REQUESTS, LEASE_LOST, TAKEOVERS, STORE_ERRORS, STORE_LATENCY]
        );
    }

    #[test]
    fn render_counts_and_buckets() {
        let m = Metrics::default();
        m.request("/payments", "stored");
        m.request("/payments", "stored");
        m.store_latency("claim", 0.002);
        let text = m.render();
        assert!(text.contains("idempo_requests_total{route=\"/payments\",outcome=\"stored\"} 2"));
        assert!(text.contains(
            "idempo_store_operation_duration_seconds_bucket{op=\"claim\",le=\"0.001\"} 0"
        ));
        assert!(text.contains(
            "idempo_store_operation_duration_seconds_bucket{op=\"claim\",le=\"0.0025\"} 1"
        ));
    }
}
