//! One pass over an ASGI request's raw headers for core's admission (what
//! `idempo._host.request_headers` reads, without a Python loop), for `Admission.start_asgi`.
use pyo3::prelude::*;

use crate::names::header_name;
use pyo3::types::{PyBytes, PyDict, PyFrozenSet, PyList, PyString, PyTuple};

/// What the pass read: the key header's raw fields in order, the declared body length, the
/// last `content-type`, whether an `authorization` header came, and the fingerprinted pairs
/// (Latin-1, names as sent).
pub(crate) struct Scanned {
    pub(crate) key_fields: Vec<Vec<u8>>,
    pub(crate) declared_length: Option<u64>,
    pub(crate) content_type: Option<String>,
    pub(crate) authorization: bool,
    pub(crate) pairs: Vec<(String, String)>,
}

fn latin1(b: &[u8]) -> String {
    b.iter().map(|&c| char::from(c)).collect()
}

/// The items of an ASGI header list (a `list` or `tuple`, exactly); None for anything else.
fn items<'py>(raw: &Bound<'py, PyAny>) -> Option<Bound<'py, PyTuple>> {
    if let Ok(list) = raw.cast_exact::<PyList>() {
        Some(list.to_tuple())
    } else {
        raw.cast_exact::<PyTuple>().ok().cloned()
    }
}

/// Reads `raw` (a list or tuple of `(name, value)` tuples of `bytes`) as
/// `request_headers(raw, key_name, fingerprinted)` and `declared_length` do. `None` for any
/// other shape, or a `content-length` that is not ASCII digits within 64 bits: the host then
/// reads the headers itself (with their errors, if any), as before.
pub(crate) fn scan(
    raw: &Bound<'_, PyAny>,
    key_name: &[u8],
    fingerprinted: &Bound<'_, PyFrozenSet>,
) -> PyResult<Option<Scanned>> {
    let Some(items) = items(raw) else {
        return Ok(None);
    };
    let mut names: Vec<Vec<u8>> = Vec::with_capacity(fingerprinted.len());
    for name in fingerprinted.iter() {
        match name.cast_exact::<PyBytes>() {
            Ok(b) => names.push(b.as_bytes().to_vec()),
            Err(_) => return Ok(None),
        }
    }
    let mut out = Scanned {
        key_fields: Vec::new(),
        declared_length: None,
        content_type: None,
        authorization: false,
        pairs: Vec::new(),
    };
    let mut length: Option<Vec<u8>> = None;
    for item in items.iter() {
        let Ok(pair) = item.cast_exact::<PyTuple>() else {
            return Ok(None);
        };
        if pair.len() != 2 {
            return Ok(None);
        }
        let (Ok(name), Ok(value)) = (
            pair.get_item(0)?
                .cast_exact::<PyBytes>()
                .map(|b| b.as_bytes().to_vec()),
            pair.get_item(1)?
                .cast_exact::<PyBytes>()
                .map(|b| b.as_bytes().to_vec()),
        ) else {
            return Ok(None);
        };
        let low = name.to_ascii_lowercase();
        if low == key_name {
            out.key_fields.push(value.clone());
        }
        match low.as_slice() {
            b"content-length" => length = Some(value.clone()),
            b"content-type" => out.content_type = Some(latin1(&value)),
            b"authorization" => out.authorization = true,
            _ => {}
        }
        if names.contains(&low) {
            out.pairs.push((latin1(&name), latin1(&value)));
        }
    }
    if let Some(digits) = length {
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Ok(None);
        }
        let Some(n) = std::str::from_utf8(&digits)
            .ok()
            .and_then(|t| t.parse::<u64>().ok())
        else {
            return Ok(None);
        };
        out.declared_length = Some(n);
    }
    Ok(Some(out))
}

/// An ASGI response's raw headers as `idempo.asgi._Capture` keeps them: the `(name, value)`
/// pairs decoded as Latin-1, and whether one is a `content-length` (names compared without
/// regard to ASCII case). None for any shape but a list or tuple of 2-tuples of `bytes`: the
/// host decodes them itself, as before.
#[pyfunction]
pub(crate) fn asgi_response_headers<'py>(
    py: Python<'py>,
    raw: &Bound<'py, PyAny>,
) -> PyResult<Option<(Bound<'py, PyList>, bool)>> {
    let Some(items) = items(raw) else {
        return Ok(None);
    };
    let out = PyList::empty(py);
    let mut length = false;
    for item in items.iter() {
        let Some((name, value)) = pair_of::<PyBytes>(&item)? else {
            return Ok(None);
        };
        let name = name.as_bytes();
        length = length || name.eq_ignore_ascii_case(b"content-length");
        out.append((header_name(py, &latin1(name)), latin1(value.as_bytes())))?;
    }
    Ok(Some((out, length)))
}

/// A header item's name and value when it is a 2-tuple of two objects of exactly type `T`; None
/// for any other shape.
fn pair_of<'py, T: pyo3::PyTypeInfo>(
    item: &Bound<'py, PyAny>,
) -> PyResult<Option<(Bound<'py, T>, Bound<'py, T>)>> {
    let Ok(pair) = item.cast_exact::<PyTuple>() else {
        return Ok(None);
    };
    if pair.len() != 2 {
        return Ok(None);
    }
    let (name, value) = (pair.get_item(0)?, pair.get_item(1)?);
    Ok(match (name.cast_exact::<T>(), value.cast_exact::<T>()) {
        (Ok(name), Ok(value)) => Some((name.clone(), value.clone())),
        _ => None,
    })
}

/// `text` encoded as Latin-1 (as Python's `str.encode("latin-1")`); None when a character is
/// outside it (or a lone surrogate).
fn latin1_of(text: &Bound<'_, PyString>) -> Option<Vec<u8>> {
    let text = text.to_cow().ok()?;
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        out.push(u8::try_from(u32::from(c)).ok()?);
    }
    Some(out)
}

/// The `headers` of the `http.response.start` message a host sends for an answer of its own
/// (a replay, a problem), as `idempo.asgi._send` makes them: `headers` (a list or tuple of
/// 2-tuples of `str`) encoded as Latin-1, with `content-length: body_len` added when no header
/// is one (`idempo._host.with_content_length`). None for any other shape, or a character
/// outside Latin-1: the host encodes them itself (raising as it always did).
#[pyfunction]
pub(crate) fn asgi_start_headers<'py>(
    py: Python<'py>,
    headers: &Bound<'py, PyAny>,
    body_len: usize,
) -> PyResult<Option<Bound<'py, PyList>>> {
    let Some(items) = items(headers) else {
        return Ok(None);
    };
    let out = PyList::empty(py);
    let mut length = false;
    for item in items.iter() {
        let Some((name, value)) = pair_of::<PyString>(&item)? else {
            return Ok(None);
        };
        let (Some(name), Some(value)) = (latin1_of(&name), latin1_of(&value)) else {
            return Ok(None);
        };
        // Within Latin-1, Python's str.lower() folds only ASCII letters to ASCII.
        length = length || name.eq_ignore_ascii_case(b"content-length");
        out.append((PyBytes::new(py, &name), PyBytes::new(py, &value)))?;
    }
    if !length {
        out.append((
            PyBytes::new(py, b"content-length"),
            PyBytes::new(py, body_len.to_string().as_bytes()),
        ))?;
    }
    Ok(Some(out))
}

/// An ASGI scope's concrete request target as `idempo.asgi._target` reads it (spec/CANONICAL.md
/// §2.1): the `raw_path` (else the `path`) and, when not empty, `?` and the `query_string`,
/// bytes read as Latin-1. None for a scope of another shape (not a `dict`; a `raw_path` or
/// `query_string` present but not `bytes` or None; no `raw_path` and a `path` that is not a
/// `str`): the host reads it itself, as before.
#[pyfunction]
pub(crate) fn asgi_target(scope: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let Ok(scope) = scope.cast_exact::<PyDict>() else {
        return Ok(None);
    };
    let bytes_of = |name: &str| -> PyResult<Option<Option<Vec<u8>>>> {
        // Some(None): absent, None or empty (falsy); Some(Some(b)): non-empty bytes; None: other.
        match scope.get_item(name)? {
            None => Ok(Some(None)),
            Some(v) if v.is_none() => Ok(Some(None)),
            Some(v) => match v.cast_exact::<PyBytes>() {
                Ok(b) if b.as_bytes().is_empty() => Ok(Some(None)),
                Ok(b) => Ok(Some(Some(b.as_bytes().to_vec()))),
                Err(_) => Ok(None),
            },
        }
    };
    let (Some(raw_path), Some(query)) = (bytes_of("raw_path")?, bytes_of("query_string")?) else {
        return Ok(None);
    };
    let mut target = match raw_path {
        Some(raw) => latin1(&raw),
        None => match scope.get_item("path")? {
            None => String::new(),
            Some(p) => match p.cast_exact::<PyString>() {
                Ok(text) => match text.to_cow() {
                    Ok(path) => path.into_owned(),
                    Err(_) => return Ok(None), // not UTF-8 (lone surrogates): the host's
                },
                Err(_) => return Ok(None),
            },
        },
    };
    if let Some(q) = query {
        target.push('?');
        target.push_str(&latin1(&q));
    }
    Ok(Some(target))
}
