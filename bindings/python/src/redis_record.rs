//! The Redis record hash (`spec/STORAGE.md` §5.1) for `idempo.stores.redis`: decoding an
//! `HGETALL` reply is core's (`RecordRow::from_redis_hash`), as in Node and the gateway.
use idempo_core::record::RecordRow;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::RecordCorrupt;

/// `(fingerprint, state, token, generation, lease_until, expires_at, response)`.
type Row<'py> = (
    String,
    i64,
    Bound<'py, PyBytes>,
    i64,
    Option<i64>,
    i64,
    Option<Bound<'py, PyBytes>>,
);

/// The row of a record hash from an `HGETALL` reply as a flat field/value list of `bytes`, or
/// `None` for an empty reply. Raises `RecordCorrupt` for an odd list, a missing field or a number
/// that is not one.
#[pyfunction]
pub(crate) fn redis_hash_row<'py>(
    py: Python<'py>,
    flat: Vec<Bound<'py, PyBytes>>,
) -> PyResult<Option<Row<'py>>> {
    if flat.len() % 2 != 0 {
        return Err(PyErr::new::<RecordCorrupt, _>(format!(
            "HGETALL answered {} items (field/value pairs expected)",
            flat.len()
        )));
    }
    let pairs = flat
        .chunks_exact(2)
        .map(|p| (p[0].as_bytes(), p[1].as_bytes()));
    let row = RecordRow::from_redis_hash(pairs)
        .map_err(|e| PyErr::new::<RecordCorrupt, _>(e.to_string()))?;
    Ok(row.map(|r| {
        (
            r.fingerprint,
            r.state,
            PyBytes::new(py, &r.token),
            r.generation,
            r.lease_until_ms,
            r.expires_at_ms,
            r.response.map(|b| PyBytes::new(py, &b)),
        )
    }))
}
