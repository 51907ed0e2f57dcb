//! Idempotency keys (`idempo_core::key`) for Python: parsing the header, its sf-string form and
//! fresh keys.

use idempo_core::key::{self, IdempotencyKey, KeyOptions};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::convert::with_bytes;
use crate::errors::{invalid_argument, key_error};

// The Python signatures spell the key length defaults out (so stubs can check them).
const _: () = assert!(key::DEFAULT_MIN_LEN == 8 && key::DEFAULT_MAX_LEN == 128);

fn key_options(
    py: Python<'_>,
    strict: bool,
    min_len: usize,
    max_len: usize,
) -> PyResult<KeyOptions> {
    KeyOptions::new(min_len, max_len)
        .map(|o| o.with_strict(strict))
        .map_err(|e| invalid_argument(py, e.to_string(), e.code()))
}

/// Parses an `Idempotency-Key` header value (sf-string or bare token) into the key text.
#[pyfunction]
#[pyo3(signature = (value, *, strict = false, min_len = 8, max_len = 128))]
pub(crate) fn parse_key(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    strict: bool,
    min_len: usize,
    max_len: usize,
) -> PyResult<String> {
    let opts = key_options(py, strict, min_len, max_len)?;
    let parsed = with_bytes(value, |raw| key::parse_key_bytes(raw, &opts))?;
    parsed
        .map(|k| k.as_str().to_owned())
        .map_err(|e| key_error(py, &e))
}

/// Parses a header value and also reports how it was written:
/// `(key, form, ignored_parameters, canonical_header_value)`.
#[pyfunction]
#[pyo3(signature = (value, *, strict = false, min_len = 8, max_len = 128))]
pub(crate) fn parse_key_details(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    strict: bool,
    min_len: usize,
    max_len: usize,
) -> PyResult<(String, &'static str, usize, String)> {
    let opts = key_options(py, strict, min_len, max_len)?;
    let parsed = with_bytes(value, |raw| key::parse_key_detailed(raw, &opts))?;
    parsed
        .map(|p| {
            (
                p.key.as_str().to_owned(),
                p.form.as_str(),
                p.ignored_parameters,
                p.key.to_header_value(),
            )
        })
        .map_err(|e| key_error(py, &e))
}

/// The sf-string header value (`"..."`) that carries `key`.
#[pyfunction]
pub(crate) fn key_header_value(py: Python<'_>, key: &Bound<'_, PyString>) -> PyResult<String> {
    let opts = key_options(py, false, 1, key::MAX_LEN_LIMIT)?;
    IdempotencyKey::from_text(&key.to_cow()?, &opts)
        .map(|k| k.to_header_value())
        .map_err(|e| key_error(py, &e))
}

/// A fresh key (UUIDv4 shape) from 16 bytes of entropy: `os.urandom(16)` unless given.
#[pyfunction]
#[pyo3(signature = (entropy = None))]
pub(crate) fn generate_key(py: Python<'_>, entropy: Option<Vec<u8>>) -> PyResult<String> {
    let entropy = match entropy {
        Some(bytes) => <[u8; 16]>::try_from(bytes.as_slice()).map_err(|_| {
            invalid_argument(py, "entropy must be 16 bytes".to_owned(), "invalid_entropy")
        })?,
        None => urandom16(py)?,
    };
    Ok(IdempotencyKey::generate(entropy).as_str().to_owned())
}

/// 16 bytes from `os.urandom` (the host's entropy source).
pub(crate) fn urandom16(py: Python<'_>) -> PyResult<[u8; 16]> {
    let raw: Vec<u8> = py.import("os")?.call_method1("urandom", (16,))?.extract()?;
    <[u8; 16]>::try_from(raw.as_slice())
        .map_err(|_| PyTypeError::new_err("os.urandom(16) did not return 16 bytes"))
}
