//! The fixed shapes of the exported metrics, read from core (`spec/METRICS.md`).
use napi_derive::napi;

/// Histogram bounds, in seconds, of `idempo_store_operation_duration_seconds`.
#[napi]
#[must_use]
pub fn store_latency_buckets() -> Vec<f64> {
    idempo_core::metrics::STORE_LATENCY_BUCKETS_SECONDS.to_vec()
}
