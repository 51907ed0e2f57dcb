//! Client intents (`idempo_core::intent`, `spec/KEYS.md` §3.6): thin wrappers over core.
use idempo_core::intent::{self, PendingIntent};
use pyo3::prelude::*;

use crate::convert::with_bytes;
use crate::errors::{fingerprint_error, invalid_argument};

/// The fingerprint binding a client request to its intent's key (core's v1 fingerprint of the
/// method, the target URL, the `Content-Type` and the body).
#[pyfunction]
#[pyo3(signature = (method, target, content_type, body))]
pub(crate) fn intent_request_fingerprint(
    py: Python<'_>,
    method: &str,
    target: &str,
    content_type: Option<&str>,
    body: &Bound<'_, PyAny>,
) -> PyResult<String> {
    with_bytes(body, |b| {
        intent::request_fingerprint(method, target, content_type, b)
    })?
    .map(|f| f.to_string())
    .map_err(|e| fingerprint_error(py, &e))
}

/// What to do with a send under an intent: `"mint"`, `"reuse"`,
/// `"intent_changed_while_pending"` or `"intent_key_differs_from_pending"`. `pending` is the
/// intent's record as `(key, fingerprint, created_ms)`, or None.
#[pyfunction]
#[pyo3(signature = (pending, request_fingerprint, explicit_key = None))]
pub(crate) fn intent_decide_send(
    py: Python<'_>,
    pending: Option<(String, String, u64)>,
    request_fingerprint: &str,
    explicit_key: Option<&str>,
) -> PyResult<&'static str> {
    let pending = pending.map(|(key, fingerprint, created_ms)| PendingIntent {
        key,
        fingerprint,
        created_ms,
    });
    intent::decide_send(pending.as_ref(), request_fingerprint, explicit_key)
        .map(|d| d.code())
        .map_err(|e| invalid_argument(py, e.to_string(), e.code()))
}
