//! Core's bounded memory store (`idempo_core::machine::memory`, `spec/STORAGE.md` §8) and the
//! cache rule (`idempo_core::machine::cache`, §9) for `idempo.stores`.
//!
//! `MemoryStoreCore` converts arguments and results only: capacity, eviction (expired records
//! only) and the per-partition quotas are core's. The Python `MemoryStore` holds the lock, the
//! clock and the fork check around it.
use idempo_core::machine::cache;
use idempo_core::machine::memory::{
    MemoryError, MemoryLimits, MemoryStore, Partition, default_partition_share,
};
use idempo_core::machine::store::ClaimOutcome;
use idempo_core::machine::{StoreOp, StoreResult};
use idempo_core::record::{FencingToken, FingerprintText, Record, StoredResponse};
use idempo_core::scope::ScopeId;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyModule, PyTuple, PyType};

use crate::errors::{RecordCorrupt, StoreUnavailable, invalid_argument, to_py, with_attrs};

fn scope_key(py: Python<'_>, b: &[u8]) -> PyResult<ScopeId> {
    let bytes: [u8; 32] = b
        .try_into()
        .map_err(|_| invalid_argument(py, "a scope key is 32 bytes".into(), "invalid_scope_key"))?;
    Ok(ScopeId::from_bytes(bytes))
}

fn token(py: Python<'_>, b: &[u8]) -> PyResult<FencingToken> {
    FencingToken::from_slice(b).map_err(|e| invalid_argument(py, e.to_string(), "invalid_token"))
}

fn positive(py: Python<'_>, v: u64, name: &str) -> PyResult<usize> {
    if v == 0 {
        return Err(invalid_argument(
            py,
            format!("{name} must be positive"),
            "invalid_limit",
        ));
    }
    Ok(usize::try_from(v).unwrap_or(usize::MAX))
}

/// A refusal of core's store as `StoreUnavailable` with `reason` (`"store_full"` or
/// `"partition_quota"`) and `retry_after` (seconds).
fn refused(py: Python<'_>, e: MemoryError) -> PyErr {
    let reason = match e {
        MemoryError::Full { .. } => "store_full",
        MemoryError::QuotaExceeded { .. } => "partition_quota",
    };
    #[allow(clippy::cast_precision_loss)]
    let seconds = e.retry_after_ms() as f64 / 1000.0;
    with_attrs::<StoreUnavailable>(
        py,
        e.to_string(),
        &[
            ("reason", to_py(py, reason)),
            ("retry_after", to_py(py, seconds)),
        ],
    )
}

/// `(fingerprint, state, token, generation, lease_until, expires_at, response)`.
fn row<'py>(py: Python<'py>, r: &Record) -> PyResult<Bound<'py, PyTuple>> {
    let row = r
        .to_row()
        .map_err(|e| PyErr::new::<RecordCorrupt, _>(e.to_string()))?;
    PyTuple::new(
        py,
        [
            to_py(py, row.fingerprint),
            to_py(py, row.state),
            PyBytes::new(py, &row.token).into_any().unbind(),
            to_py(py, row.generation),
            to_py(py, row.lease_until_ms),
            to_py(py, row.expires_at_ms),
            row.response
                .map_or_else(|| py.None(), |b| PyBytes::new(py, &b).into_any().unbind()),
        ],
    )
}

/// The memory store's partition (8 bytes) of a principal.
#[pyfunction]
pub(crate) fn memory_partition<'py>(py: Python<'py>, principal: &str) -> Bound<'py, PyBytes> {
    PyBytes::new(py, Partition::of_principal(principal).as_bytes())
}

/// Core's serve rule: whether a cached entry may be served at the cache's time.
#[pyfunction]
pub(crate) fn cache_servable(state: i64, expires_at: u64, now_ms: u64) -> bool {
    cache::servable(state, expires_at, now_ms)
}

/// Core's fill rule: the `PX` of a cache fill, or None (send no `SET`).
#[pyfunction]
pub(crate) fn cache_fill_px(
    state: i64,
    expires_at: u64,
    cache_ttl_ms: u64,
    read_now_ms: u64,
    elapsed_ms: u64,
) -> Option<u64> {
    cache::fill_px_ms(state, expires_at, cache_ttl_ms, read_now_ms, elapsed_ms)
}

/// Core's bounded memory store; every call takes the store's time `now_ms`.
#[pyclass(module = "idempo._idempo")]
pub(crate) struct MemoryStoreCore {
    inner: MemoryStore,
}

/// A `MemoryStore` as the flow's own calls drive it (`ServerFlow.start`, `handler_finished`,
/// `handler_failed` with `memory=`): its core, its lock and its step (the fork check and the
/// clock, `MemoryStore._step`), and the request's partition. A translation shortcut, not a
/// decision: core's flow asks for the primitive, core's memory store executes it (`run`) and
/// the result goes back into the flow, exactly as the host loop does through the store's
/// methods, minus the crossings and the objects between.
#[pyclass(frozen, module = "idempo._idempo")]
pub(crate) struct InlineMemory {
    core: Py<MemoryStoreCore>,
    lock: Py<PyAny>,
    /// The lock's `acquire` and `release`, taken once when it is a `threading.Lock` (whose
    /// methods cannot be replaced); else they are looked up at each use.
    methods: Option<(Py<PyAny>, Py<PyAny>)>,
    step: Py<PyAny>,
    partition: Option<Partition>,
    /// The `MemoryStore` whose unreplaced `_step` `step` is: its usual case (no fork, the
    /// default clock) is read here, without calling it.
    store: Option<Py<PyAny>>,
}

/// `idempo.stores.memory` (imported at the first step read here).
static MEMORY_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

#[pymethods]
impl InlineMemory {
    /// `core`: the store's `MemoryStoreCore`; `lock`: its lock (`acquire()`/`release()`);
    /// `step`: called holding the lock, returns the store's now in ms; `partition`: 8 bytes;
    /// `store`: the `MemoryStore` when `step` is its own `MemoryStore._step`, unreplaced.
    #[new]
    #[pyo3(signature = (core, lock, step, partition=None, store=None))]
    fn new(
        py: Python<'_>,
        core: Py<MemoryStoreCore>,
        lock: Py<PyAny>,
        step: Py<PyAny>,
        partition: Option<&[u8]>,
        store: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let partition = partition
            .map(|b| {
                b.try_into().map(Partition).map_err(|_| {
                    invalid_argument(py, "a partition is 8 bytes".into(), "invalid_partition")
                })
            })
            .transpose()?;
        let methods = thread_lock_methods(lock.bind(py));
        Ok(Self {
            core,
            lock,
            methods,
            step,
            partition,
            store,
        })
    }
}

/// The type of `threading.Lock()` (made once).
static THREAD_LOCK: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// `lock.acquire` and `lock.release` when `lock` is exactly a `threading.Lock`; else None.
fn thread_lock_methods(lock: &Bound<'_, PyAny>) -> Option<(Py<PyAny>, Py<PyAny>)> {
    let py = lock.py();
    let kind = THREAD_LOCK
        .get_or_try_init(py, || -> PyResult<Py<PyType>> {
            let made = PyModule::import(py, "threading")?.call_method0("Lock")?;
            Ok(made.get_type().unbind())
        })
        .ok()?;
    if !lock.get_type().is(kind.bind(py)) {
        return None;
    }
    let acquire = lock.getattr(intern!(py, "acquire")).ok()?;
    let release = lock.getattr(intern!(py, "release")).ok()?;
    Some((acquire.unbind(), release.unbind()))
}

/// What `MemoryStore._step` returns or raises in its usual case, read as it reads it: the
/// store's process is this one (`self._pid == _PID[0]`) and its clock is the module's
/// `_monotonic_ms` (`time.monotonic_ns() // 1_000_000`, with the module's `time`). None for any
/// other case, or a read that fails (a forked process, another clock): the caller calls the
/// step itself.
fn usual_now<'py>(
    py: Python<'py>,
    store: &Bound<'py, PyAny>,
) -> Option<PyResult<Bound<'py, PyAny>>> {
    let module = MEMORY_MODULE
        .get_or_try_init(py, || {
            PyModule::import(py, "idempo.stores.memory").map(Bound::unbind)
        })
        .ok()?
        .bind(py);
    let current = module.getattr(intern!(py, "_PID")).ok()?.get_item(0).ok()?;
    if store.getattr(intern!(py, "_pid")).ok()?.ne(current).ok()? {
        return None;
    }
    let clock = store.getattr(intern!(py, "_clock")).ok()?;
    if !clock.is(&module.getattr(intern!(py, "_monotonic_ms")).ok()?) {
        return None;
    }
    let time = module.getattr(intern!(py, "time")).ok()?;
    // From here on what the step would do: its clock's call, and its result or error.
    Some(
        time.call_method0(intern!(py, "monotonic_ns"))
            .and_then(|ns| ns.floor_div(1_000_000)),
    )
}

impl InlineMemory {
    /// Runs `op` as the store's own method would (holding its lock, at its step's time) when it
    /// is a primitive of the common paths (claim, complete, release). `None`: the host runs `op`
    /// through the store as usual. That is any other primitive, a refusal (full, over quota),
    /// and a step that raised (a forked process): the store changed nothing, and the store's
    /// own method then raises the error into the host's error handling and hooks.
    pub(crate) fn run(&self, py: Python<'_>, op: &StoreOp) -> Option<StoreResult> {
        if !matches!(
            op,
            StoreOp::Claim { .. } | StoreOp::Complete { .. } | StoreOp::Release { .. }
        ) {
            return None;
        }
        let lock = self.lock.bind(py);
        match &self.methods {
            Some((acquire, _)) => acquire.bind(py).call0().ok()?,
            None => lock.call_method0(intern!(py, "acquire")).ok()?,
        };
        let out = self.locked(py, op);
        // Releasing a lock this call holds does not fail; if it did, `out` is still what the
        // store did.
        let _ = match &self.methods {
            Some((_, release)) => release.bind(py).call0(),
            None => lock.call_method0(intern!(py, "release")),
        };
        out
    }

    fn locked(&self, py: Python<'_>, op: &StoreOp) -> Option<StoreResult> {
        // A read that fails or finds another case calls the step, as it always did.
        let usual = self.store.as_ref().and_then(|s| usual_now(py, s.bind(py)));
        let now = match usual {
            Some(now) => now.ok()?,
            None => self.step.bind(py).call0().ok()?,
        };
        let now_ms: u64 = now.extract().ok()?;
        let mut core = self.core.bind(py).try_borrow_mut().ok()?;
        core.inner.run(op, self.partition, now_ms).ok()
    }
}

#[pymethods]
impl MemoryStoreCore {
    #[new]
    #[pyo3(signature = (max_entries, max_bytes, max_entries_per_partition=None, max_bytes_per_partition=None))]
    fn new(
        py: Python<'_>,
        max_entries: u64,
        max_bytes: u64,
        max_entries_per_partition: Option<u64>,
        max_bytes_per_partition: Option<u64>,
    ) -> PyResult<Self> {
        let entries = positive(py, max_entries, "max_entries")?;
        let bytes = positive(py, max_bytes, "max_bytes")?;
        let limits = MemoryLimits {
            max_entries: entries,
            max_bytes: bytes,
            max_entries_per_partition: match max_entries_per_partition {
                Some(v) => positive(py, v, "max_entries_per_partition")?,
                None => default_partition_share(entries),
            },
            max_bytes_per_partition: match max_bytes_per_partition {
                Some(v) => positive(py, v, "max_bytes_per_partition")?,
                None => default_partition_share(bytes),
            },
        };
        Ok(Self {
            inner: MemoryStore::new(limits),
        })
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Bytes held.
    #[getter]
    fn bytes_used(&self) -> usize {
        self.inner.bytes()
    }

    /// The per-partition record quota in force.
    #[getter]
    fn max_entries_per_partition(&self) -> usize {
        self.inner.limits().max_entries_per_partition
    }

    /// Primitive 1: `(True, generation, None)` or `(False, 0, row)`; raises `StoreUnavailable`
    /// when the record does not fit.
    #[pyo3(signature = (scope_key, fingerprint, token, lease_ms, ttl_ms, now_ms, partition=None))]
    #[allow(clippy::too_many_arguments)]
    fn claim<'py>(
        &mut self,
        py: Python<'py>,
        scope_key: &[u8],
        fingerprint: &str,
        token: &[u8],
        lease_ms: u64,
        ttl_ms: u64,
        now_ms: u64,
        partition: Option<&[u8]>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let k = self::scope_key(py, scope_key)?;
        let fp = FingerprintText::new(fingerprint)
            .map_err(|e| invalid_argument(py, e.to_string(), "invalid_fingerprint"))?;
        let t = self::token(py, token)?;
        let p = partition
            .map(|b| {
                b.try_into().map(Partition).map_err(|_| {
                    invalid_argument(py, "a partition is 8 bytes".into(), "invalid_partition")
                })
            })
            .transpose()?;
        match self
            .inner
            .claim(k, p, &fp, t, lease_ms, ttl_ms, now_ms)
            .map_err(|e| refused(py, e))?
        {
            ClaimOutcome::Claimed { generation } => {
                PyTuple::new(py, [to_py(py, true), to_py(py, generation), py.None()])
            }
            ClaimOutcome::Existing(r) => PyTuple::new(
                py,
                [
                    to_py(py, false),
                    to_py(py, 0),
                    row(py, &r)?.into_any().unbind(),
                ],
            ),
        }
    }

    /// Primitive 2: the row (an expired one included) or None.
    fn get<'py>(&self, py: Python<'py>, scope_key: &[u8]) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let k = self::scope_key(py, scope_key)?;
        self.inner.get(&k).map(|r| row(py, r)).transpose()
    }

    /// Primitive 3.
    fn takeover(
        &mut self,
        py: Python<'_>,
        scope_key: &[u8],
        seen_token: &[u8],
        new_token: &[u8],
        lease_ms: u64,
        now_ms: u64,
    ) -> PyResult<Option<u32>> {
        let (k, seen, new) = (
            self::scope_key(py, scope_key)?,
            token(py, seen_token)?,
            token(py, new_token)?,
        );
        Ok(self.inner.takeover(k, seen, new, lease_ms, now_ms))
    }

    /// Primitive 4.
    fn mark_unknown(
        &mut self,
        py: Python<'_>,
        scope_key: &[u8],
        seen_token: &[u8],
        ttl_ms: u64,
        now_ms: u64,
    ) -> PyResult<bool> {
        let (k, seen) = (self::scope_key(py, scope_key)?, token(py, seen_token)?);
        Ok(self.inner.mark_unknown(k, seen, ttl_ms, now_ms))
    }

    /// Primitive 5 (`response`: the encoded column); raises `StoreUnavailable` when it does
    /// not fit, `RecordCorrupt` when it does not decode.
    fn complete(
        &mut self,
        py: Python<'_>,
        scope_key: &[u8],
        token: &[u8],
        response: &[u8],
        ttl_ms: u64,
        now_ms: u64,
    ) -> PyResult<bool> {
        let (k, t) = (self::scope_key(py, scope_key)?, self::token(py, token)?);
        let resp = StoredResponse::decode(response)
            .map_err(|e| PyErr::new::<RecordCorrupt, _>(e.to_string()))?;
        self.inner
            .complete(k, t, resp, ttl_ms, now_ms)
            .map_err(|e| refused(py, e))
    }

    /// Primitive 6.
    fn release(&mut self, py: Python<'_>, scope_key: &[u8], token: &[u8]) -> PyResult<bool> {
        let (k, t) = (self::scope_key(py, scope_key)?, self::token(py, token)?);
        Ok(self.inner.release(k, t))
    }

    /// Primitive 7.
    fn renew(
        &mut self,
        py: Python<'_>,
        scope_key: &[u8],
        token: &[u8],
        lease_ms: u64,
        now_ms: u64,
    ) -> PyResult<bool> {
        let (k, t) = (self::scope_key(py, scope_key)?, self::token(py, token)?);
        Ok(self.inner.renew(k, t, lease_ms, now_ms))
    }

    /// Primitive 8: `(in_progress, completed, outcome_unknown)` deleted.
    fn purge_expired(&mut self, batch: usize, now_ms: u64) -> (u64, u64, u64) {
        let c = self.inner.purge_expired(batch, now_ms);
        (c.in_progress, c.completed, c.outcome_unknown)
    }
}
