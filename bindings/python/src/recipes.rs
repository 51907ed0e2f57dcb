//! The store recipes of `spec/STORAGE.md` (SQL and Lua texts), read-only from core.
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Every store recipe of `idempo_core::recipes` by name (`postgres_claim`, `sqlite_get`,
/// `redis_complete`, …): the SQL and Lua the stores run, written once in core.
#[pyfunction]
pub(crate) fn recipes(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    for (name, text) in idempo_core::recipes::ALL {
        out.set_item(*name, *text)?;
    }
    Ok(out)
}
