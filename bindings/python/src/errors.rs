//! Python exception classes, one per error kind, with the common base `IdempotencyError`.
//!
//! The classes are created here (so the extension can raise them without importing Python code)
//! and re-exported by `idempo`. Extra context travels as instance attributes (`code`, `offset`,
//! `pointer`, `retry_after`) set when the exception is built.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    idempo,
    IdempotencyError,
    PyException,
    "Base class of every error raised by idempo."
);
create_exception!(
    idempo,
    InvalidKey,
    IdempotencyError,
    "The Idempotency-Key header value is malformed (answered with 400)."
);
create_exception!(
    idempo,
    MissingKey,
    IdempotencyError,
    "A route that requires an Idempotency-Key received none (answered with 400)."
);
create_exception!(
    idempo,
    CanonicalizationError,
    IdempotencyError,
    "The body is not canonicalizable JSON; `code`, `offset` and `pointer` say where and why."
);
create_exception!(
    idempo,
    FingerprintError,
    IdempotencyError,
    "The request could not be fingerprinted (bad options or a body core rejects)."
);
create_exception!(
    idempo,
    KeyInUse,
    IdempotencyError,
    "Another request with this key is still running (409); retry after `retry_after` seconds."
);
create_exception!(
    idempo,
    KeyReusedWithDifferentRequest,
    IdempotencyError,
    "The key was already used for a different request (422); use a new key."
);
create_exception!(
    idempo,
    OutcomeUnknown,
    IdempotencyError,
    "A former attempt with this key may have had its effect but never completed; use a new key."
);
create_exception!(
    idempo,
    StoreUnavailable,
    IdempotencyError,
    "The record store failed or is unreachable; fail closed (503, retry after `retry_after`)."
);
create_exception!(
    idempo,
    LeaseLost,
    IdempotencyError,
    "This worker's claim was taken over or expired; its result must not be stored."
);
create_exception!(
    idempo,
    RecordCorrupt,
    IdempotencyError,
    "A stored record or response could not be decoded."
);
create_exception!(
    idempo,
    RequestTooLarge,
    IdempotencyError,
    "The request body exceeds the configured limit (answered with 413)."
);
create_exception!(
    idempo,
    InvalidArgument,
    IdempotencyError,
    "An argument passed to idempo is out of range or malformed."
);

/// Adds every exception class to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("IdempotencyError", py.get_type::<IdempotencyError>())?;
    m.add("InvalidKey", py.get_type::<InvalidKey>())?;
    m.add("MissingKey", py.get_type::<MissingKey>())?;
    m.add(
        "CanonicalizationError",
        py.get_type::<CanonicalizationError>(),
    )?;
    m.add("FingerprintError", py.get_type::<FingerprintError>())?;
    m.add("KeyInUse", py.get_type::<KeyInUse>())?;
    m.add(
        "KeyReusedWithDifferentRequest",
        py.get_type::<KeyReusedWithDifferentRequest>(),
    )?;
    m.add("OutcomeUnknown", py.get_type::<OutcomeUnknown>())?;
    m.add("StoreUnavailable", py.get_type::<StoreUnavailable>())?;
    m.add("LeaseLost", py.get_type::<LeaseLost>())?;
    m.add("RecordCorrupt", py.get_type::<RecordCorrupt>())?;
    m.add("RequestTooLarge", py.get_type::<RequestTooLarge>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    Ok(())
}
