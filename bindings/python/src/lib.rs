//! `idempo._idempo`: the Python extension module over `idempo-core`.
//!
//! This crate is deliberately thin: it converts Python values to core types and back, maps core
//! errors to Python exception classes, and makes no protocol decision of its own. Every function
//! takes raw bytes where core does, and no input can make it panic: conversions are fallible and
//! every core error becomes a typed Python exception.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![forbid(unsafe_code)]

mod admit;
mod asgi_headers;
mod busy;
mod call;
mod canonical;
mod convert;
mod errors;
mod fingerprint;
mod flow;
mod intent;
mod key;
mod memory;
mod names;
mod options;
mod recipes;
mod redis_check;
mod redis_record;
mod retry;
mod scope;

use pyo3::prelude::*;

/// The extension module. The public `idempo` package re-exports what it defines.
#[pymodule]
fn _idempo(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    call::register(m)?;
    m.add_function(wrap_pyfunction!(canonical::canonicalize, m)?)?;
    m.add_function(wrap_pyfunction!(asgi_headers::asgi_response_headers, m)?)?;
    m.add_function(wrap_pyfunction!(asgi_headers::asgi_start_headers, m)?)?;
    m.add_function(wrap_pyfunction!(asgi_headers::asgi_target, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(key::parse_key, m)?)?;
    m.add_function(wrap_pyfunction!(key::generate_key, m)?)?;
    m.add_function(wrap_pyfunction!(key::parse_key_details, m)?)?;
    m.add_function(wrap_pyfunction!(key::key_header_value, m)?)?;
    m.add_function(wrap_pyfunction!(scope::scope_id, m)?)?;
    m.add_function(wrap_pyfunction!(retry::parse_retry_after, m)?)?;
    m.add_function(wrap_pyfunction!(retry::response_body_needed, m)?)?;
    m.add_function(wrap_pyfunction!(intent::intent_request_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(intent::intent_decide_send, m)?)?;
    m.add_function(wrap_pyfunction!(flow::encode_response, m)?)?;
    m.add_function(wrap_pyfunction!(flow::decode_response, m)?)?;
    m.add_function(wrap_pyfunction!(flow::body_problem, m)?)?;
    m.add_function(wrap_pyfunction!(flow::unavailable_problem, m)?)?;
    m.add_function(wrap_pyfunction!(recipes::recipes, m)?)?;
    m.add_function(wrap_pyfunction!(busy::sqlite_setup_pause_ms, m)?)?;
    m.add_function(wrap_pyfunction!(
        redis_check::redis_cluster_node_refusal,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(redis_check::redis_policy_refusal, m)?)?;
    m.add_function(wrap_pyfunction!(redis_check::redis_config_get_refusal, m)?)?;
    m.add_function(wrap_pyfunction!(redis_record::redis_hash_row, m)?)?;
    m.add_function(wrap_pyfunction!(options::option_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(memory::memory_partition, m)?)?;
    m.add_function(wrap_pyfunction!(memory::cache_servable, m)?)?;
    m.add_function(wrap_pyfunction!(memory::cache_fill_px, m)?)?;
    m.add(
        "STORE_LATENCY_BUCKETS",
        pyo3::types::PyTuple::new(m.py(), idempo_core::metrics::STORE_LATENCY_BUCKETS_SECONDS)?,
    )?;
    m.add_class::<flow::Config>()?;
    m.add_class::<admit::Admission>()?;
    m.add_class::<admit::ScopeRule>()?;
    m.add_class::<flow::ServerFlow>()?;
    m.add_class::<flow::Action>()?;
    m.add_class::<flow::Cleanup>()?;
    m.add_class::<flow::BodyCapture>()?;
    m.add_class::<fingerprint::Fingerprinter>()?;
    m.add_class::<fingerprint::RouteFingerprinter>()?;
    m.add_class::<retry::RetryPolicy>()?;
    m.add_class::<retry::RetryAdvice>()?;
    m.add_class::<memory::MemoryStoreCore>()?;
    m.add_class::<memory::InlineMemory>()?;
    Ok(())
}
