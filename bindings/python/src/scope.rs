//! Scope ids (`idempo_core::scope`) for Python.

use idempo_core::scope::ScopeId;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use crate::convert::text;

/// The 32-byte scope id of (principal, method, route template, key).
#[pyfunction]
pub(crate) fn scope_id<'py>(
    py: Python<'py>,
    principal: &Bound<'py, PyString>,
    method: &Bound<'py, PyString>,
    route: &Bound<'py, PyString>,
    key: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let key = text(key)?;
    let id = ScopeId::from_parts(
        &principal.to_cow()?,
        &method.to_cow()?,
        &route.to_cow()?,
        &key,
    );
    Ok(PyBytes::new(py, id.as_bytes()))
}
