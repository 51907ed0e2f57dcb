//! Python value conversions shared by the wrappers. Fallible, never panicking.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyTuple};

/// Bodies this large are processed with the GIL released.
pub(crate) const DETACH_THRESHOLD: usize = 16 * 1024;

/// Calls `f` with the raw bytes of a `bytes`, `bytearray` or `str` (UTF-8) object.
pub(crate) fn with_bytes<R>(obj: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> R) -> PyResult<R> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(f(b.as_bytes()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        let text = s.to_cow()?;
        return Ok(f(text.as_bytes()));
    }
    if let Ok(ba) = obj.cast::<PyByteArray>() {
        let copy = ba.to_vec();
        return Ok(f(&copy));
    }
    Err(PyTypeError::new_err(format!(
        "expected bytes, bytearray or str, got {}",
        obj.get_type().name()?
    )))
}

/// Header pairs from a mapping (`items()`) or an iterable of `(name, value)` pairs.
pub(crate) fn header_pairs(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, String)>> {
    let Some(obj) = obj else {
        return Ok(Vec::new());
    };
    if obj.is_none() {
        return Ok(Vec::new());
    }
    // Lists and tuples (the usual shapes) are read as they are: asking them for `items` would
    // raise and catch an AttributeError on every call.
    let is_sequence = obj.cast::<PyList>().is_ok() || obj.cast::<PyTuple>().is_ok();
    if is_sequence && obj.len()? == 0 {
        return Ok(Vec::new());
    }
    let items = if !is_sequence && obj.hasattr("items")? {
        obj.call_method0("items")?
    } else {
        obj.clone()
    };
    let mut out = Vec::new();
    for item in items.try_iter()? {
        let (name, value): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
        out.push((text(&name)?, text(&value)?));
    }
    Ok(out)
}

/// A `str`, or `bytes` decoded as Latin-1 (how HTTP servers hand over raw header bytes).
pub(crate) fn text(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(s.to_cow()?.into_owned());
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().iter().map(|&c| char::from(c)).collect());
    }
    Err(PyTypeError::new_err(format!(
        "expected str or bytes, got {}",
        obj.get_type().name()?
    )))
}

/// A list of strings from any iterable of `str` (None: empty).
pub(crate) fn strings(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(obj) = obj else {
        return Ok(Vec::new());
    };
    if obj.is_none() {
        return Ok(Vec::new());
    }
    if obj.cast::<PyString>().is_ok() {
        return Err(PyTypeError::new_err(
            "expected an iterable of str, got a single str",
        ));
    }
    let mut out = Vec::new();
    for item in obj.try_iter()? {
        out.push(item?.cast::<PyString>()?.to_cow()?.into_owned());
    }
    Ok(out)
}
