//! Python exception classes, one per error kind, with the common base `IdempotencyError`.
//!
//! The classes are created here (so the extension can raise them without importing Python code)
//! and re-exported by `idempo`. Extra context travels as instance attributes (`code`, `offset`,
//! `pointer`, `problem`, `retry_after`) set when the exception is built.

use pyo3::BoundObject;
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

/// Builds an exception of class `T` with `message` and extra instance attributes.
pub(crate) fn with_attrs<T: pyo3::PyTypeInfo>(
    py: Python<'_>,
    message: String,
    attrs: &[(&str, Py<PyAny>)],
) -> PyErr {
    let err = PyErr::new::<T, _>(message);
    let value = err.value(py);
    for (name, attr) in attrs {
        if let Err(e) = value.setattr(*name, attr.bind(py)) {
            return e;
        }
    }
    err
}

/// `CanonicalizationError` for a core canonicalization error (`code`, `offset`, `pointer`, and
/// `problem`: the 400/413 answer core gives for such a body, see `body_problem`).
pub(crate) fn canon_error(py: Python<'_>, e: &idempo_core::canonical::CanonError) -> PyErr {
    let pointer: Py<PyAny> = match &e.pointer {
        Some(p) => p
            .into_pyobject(py)
            .map_or_else(|_| py.None(), |s| s.into_any().unbind()),
        None => py.None(),
    };
    let answer = idempo_core::machine::problem::invalid_body(e);
    let problem = match crate::flow::respond(py, &answer, Some("invalid_body"), false)
        .and_then(|action| Py::new(py, action))
    {
        Ok(action) => action.into_any(),
        Err(err) => return err,
    };
    let attrs = [
        ("code", to_py(py, e.code())),
        ("offset", to_py(py, e.offset)),
        ("pointer", pointer),
        ("problem", problem),
    ];
    with_attrs::<CanonicalizationError>(py, e.to_string(), &attrs)
}

/// `FingerprintError` (configuration) or `CanonicalizationError` (the body) for a core error.
pub(crate) fn fingerprint_error(
    py: Python<'_>,
    e: &idempo_core::fingerprint::FingerprintError,
) -> PyErr {
    use idempo_core::fingerprint::FingerprintError as E;
    match e {
        E::Body(c) => canon_error(py, c),
        other => with_attrs::<FingerprintError>(
            py,
            other.to_string(),
            &[("code", to_py(py, other.code()))],
        ),
    }
}

/// `InvalidKey` for a core key error (`code`, `offset`).
pub(crate) fn key_error(py: Python<'_>, e: &idempo_core::key::KeyError) -> PyErr {
    let offset = match e.offset() {
        Some(o) => to_py(py, o),
        None => py.None(),
    };
    with_attrs::<InvalidKey>(
        py,
        e.to_string(),
        &[("code", to_py(py, e.code())), ("offset", offset)],
    )
}

/// `InvalidArgument` with a `code` attribute.
pub(crate) fn invalid_argument(py: Python<'_>, message: String, code: &str) -> PyErr {
    with_attrs::<InvalidArgument>(py, message, &[("code", to_py(py, code))])
}

/// Converts a plain value into a Python object (infallible for the types used here).
pub(crate) fn to_py<'py, T>(py: Python<'py>, v: T) -> Py<PyAny>
where
    T: IntoPyObject<'py>,
{
    v.into_pyobject(py)
        .map_or_else(|_| py.None(), |o| o.into_any().unbind())
}
