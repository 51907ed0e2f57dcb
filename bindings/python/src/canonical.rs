//! RFC 8785 canonical JSON (`idempo_core::canonical`) for Python: `canonicalize` and the
//! number mode and limits options that the fingerprint shares.

use idempo_core::canonical::{self, CanonOptions, Limits, NumberMode};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::convert::{DETACH_THRESHOLD, strings, with_bytes};
use crate::errors::{canon_error, invalid_argument};

/// Core's number mode named `numbers` (core's vocabulary), or `default` when None.
pub(crate) fn number_mode(
    py: Python<'_>,
    numbers: Option<&str>,
    default: NumberMode,
) -> PyResult<NumberMode> {
    numbers.map_or(Ok(default), |n| {
        n.parse::<NumberMode>()
            .map_err(|e| invalid_argument(py, e.to_string(), "invalid_number_mode"))
    })
}

pub(crate) fn limits(
    max_input_bytes: Option<usize>,
    max_depth: Option<usize>,
    max_members: Option<usize>,
) -> Limits {
    let mut l = Limits::default();
    if let Some(v) = max_members {
        l.max_members = v;
    }
    if let Some(v) = max_input_bytes {
        l.max_input_bytes = v;
    }
    if let Some(v) = max_depth {
        l.max_depth = v;
    }
    l
}

/// RFC 8785 canonical form of a JSON text (`bytes` or `str`), as bytes; `exclude` lists JSON
/// pointers of values left out.
#[pyfunction]
#[pyo3(signature = (data, *, numbers = None, exclude = None, max_input_bytes = None, max_depth = None, max_members = None))]
pub(crate) fn canonicalize<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    numbers: Option<&str>,
    exclude: Option<&Bound<'py, PyAny>>,
    max_input_bytes: Option<usize>,
    max_depth: Option<usize>,
    max_members: Option<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    let opts = CanonOptions {
        limits: limits(max_input_bytes, max_depth, max_members),
        numbers: number_mode(py, numbers, NumberMode::default())?,
    };
    let exclusions = canonical::Exclusions::new(strings(exclude)?)
        .map_err(|e| invalid_argument(py, e.to_string(), e.code()))?;
    let run = |input: &[u8]| {
        let mut out = Vec::with_capacity(input.len());
        canonical::canonicalize_excluding_to(input, &opts, &exclusions, &mut out).map(|()| out)
    };
    let result = with_bytes(data, |input| {
        if input.len() >= DETACH_THRESHOLD {
            py.detach(|| run(input))
        } else {
            run(input)
        }
    })?;
    match result {
        Ok(out) => Ok(PyBytes::new(py, &out)),
        Err(e) => Err(canon_error(py, &e)),
    }
}
