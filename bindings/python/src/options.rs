//! The host and store options' defaults, read-only from core (`idempo_core::options`).
use idempo_core::options::{OPTIONS, OptionDefault};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Every host and store option's default by owner and name
/// (`{"postgres_store": {"timeout_ms": 2000, ...}, ...}`; an unset default is `None`).
#[pyfunction]
pub(crate) fn option_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    for o in OPTIONS {
        let owner = match out.get_item(o.owner)? {
            Some(d) => d.cast_into::<PyDict>()?,
            None => {
                let d = PyDict::new(py);
                out.set_item(o.owner, &d)?;
                d
            }
        };
        match o.default {
            OptionDefault::Ms(v) | OptionDefault::Count(v) => owner.set_item(o.name, v)?,
            OptionDefault::Bool(b) => owner.set_item(o.name, b)?,
            OptionDefault::Text(t) => owner.set_item(o.name, t)?,
            OptionDefault::List(l) => owner.set_item(o.name, PyTuple::new(py, l)?)?,
            OptionDefault::Unset => owner.set_item(o.name, py.None())?,
        }
    }
    Ok(out)
}
