//! The SQLite store's wait for a setup step refused as busy (`idempo_core::busy`,
//! `spec/STORAGE.md` §7): the schedule is core's, the sleeping Python's.
use pyo3::prelude::*;

/// Seconds to pause before the next attempt after the `refused`-th busy refusal (1 for the
/// first), `waited_ms` after the first attempt began; `None` once `bound_ms` is spent.
#[pyfunction]
pub(crate) fn sqlite_setup_pause_ms(refused: u32, waited_ms: u64, bound_ms: u64) -> Option<u64> {
    idempo_core::busy::setup_pause_ms(refused, waited_ms, bound_ms)
}
