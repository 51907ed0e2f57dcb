//! The few strings a request's objects report again and again (kinds, store primitives,
//! outcomes, common header names) as Python strings made once per process instead of at every
//! read: the same text, one allocation less each time.
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// `text` as a Python string: one made once per process for a known name, else a new one.
macro_rules! once {
    ($py:expr, $text:expr, [$($known:literal),* $(,)?]) => {
        match $text {
            $($known => intern!($py, $known).clone(),)*
            other => PyString::new($py, other),
        }
    };
}

/// An action's kind, store primitive or outcome, an admission's kind, a capture plan or step.
pub(crate) fn name<'py>(py: Python<'py>, text: &str) -> Bound<'py, PyString> {
    once!(
        py,
        text,
        [
            "store",
            "run_handler",
            "wait",
            "lease_lost",
            "respond",
            "propagate_error",
            "claim",
            "get",
            "takeover",
            "mark_unknown",
            "complete",
            "release",
            "renew",
            "commit",
            "stored",
            "not_stored",
            "not_retained",
            "completion_failed",
            "not_committed",
            "handler_failed",
            "replayed",
            "in_flight",
            "mismatch",
            "outcome_unknown",
            "store_unavailable",
            "contention",
            "pass_through",
            "refuse",
            "read_body",
            "resolve_scope",
            "admitted",
        ]
    )
}

/// A header name as sent (the common lowercase ones made once).
pub(crate) fn header_name<'py>(py: Python<'py>, text: &str) -> Bound<'py, PyString> {
    once!(
        py,
        text,
        [
            "content-type",
            "content-length",
            "idempotent-replayed",
            "retry-after",
            "cache-control",
            "location",
            "etag",
            "date",
            "server",
            "vary",
        ]
    )
}
