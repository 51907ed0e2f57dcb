//! The sans-IO server flow of core, for Python hosts.
//!
//! The host loop (`idempo._flow`) executes each [`Action`] and feeds the result back; every
//! protocol decision (claim, replay, 409, 422, takeover, what to store, which problem to answer)
//! is made by `idempo_core::machine::ServerFlow`. This module only converts values: store results
//! from the Python store objects into core's `StoreResult`, and core's actions into [`Action`].

use std::sync::Arc;

use idempo_core::machine::problem::{ProblemKind, problem_response};
use idempo_core::machine::{
    Action as CoreAction, Cleanup as CoreCleanup, CleanupStep, Event, FlowError, HandlerResponse,
    HttpResponse, ServerFlow as CoreFlow, StoreOp, StoreResult,
};
use idempo_core::machine::{BodyCapture as CoreBodyCapture, CaptureStep, capture_plan};
use idempo_core::policy::{
    self, Config as CoreConfig, ConfigOptions, KeyRequirement, Redaction, ResponseOrigin,
    TakeoverPolicy,
};
use idempo_core::record::{FencingToken, FingerprintText, Record, RecordRow, StoredResponse};
use idempo_core::scope::ScopeId;
use pyo3::exceptions::PyAssertionError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple, PyType};

use crate::convert::{header_pairs, strings, with_bytes};
use crate::errors::{CanonicalizationError, invalid_argument};
use crate::memory::InlineMemory;
use crate::names::{header_name, name};

/// Per-route idempotency policy (core's `Config`), validated on construction by core's
/// `ConfigOptions::build`. Every keyword is an option of core's flat option set, spelled as in
/// core; `None` (the default of each) takes core's `Config::default()` value.
#[pyclass(frozen, module = "idempo._idempo")]
pub(crate) struct Config {
    pub(crate) inner: Arc<CoreConfig>,
}

fn config_error(py: Python<'_>, e: &policy::ConfigError) -> PyErr {
    invalid_argument(py, e.to_string(), "invalid_config")
}

#[pymethods]
impl Config {
    #[new]
    #[pyo3(signature = (
        *,
        lease_ms = None,
        heartbeat_ms = None,
        takeover = None,
        ttl_ms = None,
        key_required = None,
        key_min_len = None,
        key_max_len = None,
        key_strict = None,
        transient_statuses = None,
        store_server_errors = None,
        max_stored_body_bytes = None,
        stored_headers = None,
        redact = None,
        in_flight_retry_after_ms = None,
        unavailable_retry_after_ms = None,
        max_store_rounds = None,
        cleanup_budget_ms = None,
        max_request_body_bytes = None,
        transactional = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        lease_ms: Option<u64>,
        heartbeat_ms: Option<u64>,
        takeover: Option<&str>,
        ttl_ms: Option<u64>,
        key_required: Option<bool>,
        key_min_len: Option<usize>,
        key_max_len: Option<usize>,
        key_strict: Option<bool>,
        transient_statuses: Option<Vec<u16>>,
        store_server_errors: Option<bool>,
        max_stored_body_bytes: Option<usize>,
        stored_headers: Option<&Bound<'_, PyAny>>,
        redact: Option<bool>,
        in_flight_retry_after_ms: Option<u64>,
        unavailable_retry_after_ms: Option<u64>,
        max_store_rounds: Option<u64>,
        cleanup_budget_ms: Option<u64>,
        max_request_body_bytes: Option<usize>,
        transactional: Option<bool>,
    ) -> PyResult<Self> {
        let takeover = takeover
            .map(str::parse::<TakeoverPolicy>)
            .transpose()
            .map_err(|e| invalid_argument(py, e.to_string(), "invalid_config"))?;
        let stored_headers = match stored_headers {
            Some(obj) if !obj.is_none() => Some(strings(Some(obj))?),
            _ => None,
        };
        let options = ConfigOptions {
            lease_ms,
            heartbeat_ms,
            takeover,
            ttl_ms,
            key_required,
            key_min_len,
            key_max_len,
            key_strict,
            transient_statuses,
            store_server_errors,
            max_stored_body_bytes,
            stored_headers,
            redact,
            in_flight_retry_after_ms,
            unavailable_retry_after_ms,
            max_store_rounds,
            cleanup_budget_ms,
            max_request_body_bytes,
            transactional,
        };
        let inner = options.build().map_err(|e| config_error(py, &e))?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Lease length in ms.
    #[getter]
    fn lease_ms(&self) -> u64 {
        self.inner.lease.lease_ms()
    }

    /// Heartbeat interval in ms (None: no heartbeat).
    #[getter]
    fn heartbeat_ms(&self) -> Option<u64> {
        self.inner.lease.heartbeat_ms()
    }

    /// Record retention in ms.
    #[getter]
    fn ttl_ms(&self) -> u64 {
        self.inner.ttl_ms.get()
    }

    /// Whether requests without a key are rejected (400).
    #[getter]
    fn key_required(&self) -> bool {
        self.inner.key == KeyRequirement::Required
    }

    /// Shortest key accepted, in characters.
    #[getter]
    fn key_min_len(&self) -> usize {
        self.inner.key_options.min_len()
    }

    /// Longest key accepted, in characters.
    #[getter]
    fn key_max_len(&self) -> usize {
        self.inner.key_options.max_len()
    }

    /// Whether only the draft sf-string key form is accepted.
    #[getter]
    fn key_strict(&self) -> bool {
        self.inner.key_options.is_strict()
    }

    /// `"outcome_unknown"` or `"re_run"`.
    #[getter]
    fn takeover(&self) -> &'static str {
        self.inner.takeover.as_str()
    }

    /// Statuses never stored.
    #[getter]
    fn transient_statuses(&self) -> Vec<u16> {
        self.inner.response.transient().to_vec()
    }

    /// Whether 5xx responses (except 503) are stored.
    #[getter]
    fn store_server_errors(&self) -> bool {
        self.inner.response.store_server_errors()
    }

    /// Header names stored for replays.
    #[getter]
    fn stored_headers(&self) -> Vec<String> {
        self.inner.response.headers().names().to_vec()
    }

    /// Largest stored response body in bytes.
    #[getter]
    fn max_stored_body_bytes(&self) -> usize {
        self.inner.response.max_body_bytes()
    }

    /// Largest request body admitted in bytes (larger: 413).
    #[getter]
    fn max_request_body_bytes(&self) -> usize {
        self.inner.max_request_body_bytes.get()
    }

    /// Whether a redaction hook supplies the stored body.
    #[getter]
    fn redact(&self) -> bool {
        self.inner.response.redaction() == Redaction::HostHook
    }

    /// `Retry-After` hint on a 409, ms.
    #[getter]
    fn in_flight_retry_after_ms(&self) -> u64 {
        self.inner.in_flight_retry_after_ms.get()
    }

    /// `Retry-After` on a 503, ms.
    #[getter]
    fn unavailable_retry_after_ms(&self) -> u64 {
        self.inner.unavailable_retry_after_ms.get()
    }

    /// Store rounds before 503 contention.
    #[getter]
    fn max_store_rounds(&self) -> u8 {
        self.inner.max_store_rounds.get()
    }

    /// How long (ms) the background cleanup of a lost claim or takeover keeps retrying, at
    /// least the lease.
    #[getter]
    fn cleanup_budget_ms(&self) -> u64 {
        self.inner.cleanup_budget_ms.get()
    }

    /// Transactional mode: the claim, the handler's writes and the completion commit in one
    /// database transaction of the store.
    #[getter]
    fn transactional(&self) -> bool {
        self.inner.transactional
    }

    /// Core's capture plan for a response (`spec/PROTOCOL.md` §7.5): `("pass_through", None)`,
    /// `("buffer", limit)` or `("tee", limit)`. `streaming`: the body arrives in several parts;
    /// `framework`: the framework produced it before the handler ran (both may be passed by
    /// position too).
    #[pyo3(signature = (status, headers, streaming = false, framework = false))]
    fn capture_plan<'py>(
        &self,
        py: Python<'py>,
        status: u16,
        headers: &Bound<'py, PyAny>,
        streaming: bool,
        framework: bool,
    ) -> PyResult<(Bound<'py, PyString>, Option<usize>)> {
        let headers = header_pairs(Some(headers))?;
        let origin = if framework {
            ResponseOrigin::Framework
        } else {
            ResponseOrigin::Handler
        };
        let plan = capture_plan(&self.inner, status, origin, &headers, streaming);
        Ok((name(py, plan.as_str()), plan.limit()))
    }
}

/// Counts a response body's bytes against the recording limit (core's `BodyCapture`).
#[pyclass(module = "idempo._idempo")]
pub(crate) struct BodyCapture {
    inner: CoreBodyCapture,
}

#[pymethods]
impl BodyCapture {
    /// A capture recording at most `limit` bytes.
    #[new]
    fn new(limit: usize) -> Self {
        Self {
            inner: CoreBodyCapture::new(limit),
        }
    }

    /// Counts a chunk of `length` bytes: `"record"` (append it), `"discard"` (drop what was
    /// recorded and record nothing more) or `"skip"`.
    fn accept<'py>(&mut self, py: Python<'py>, length: usize) -> Bound<'py, PyString> {
        name(
            py,
            match self.inner.accept(length) {
                CaptureStep::Record => "record",
                CaptureStep::Discard => "discard",
                CaptureStep::Skip => "skip",
            },
        )
    }

    /// True once the body went past the limit.
    #[getter]
    fn truncated(&self) -> bool {
        self.inner.truncated()
    }
}

/// One step for the host: a store primitive to run, the handler to run, or the answer.
#[pyclass(frozen, module = "idempo._idempo")]
pub(crate) struct Action {
    /// `"store"`, `"run_handler"`, `"wait"`, `"lease_lost"`, `"respond"` or `"propagate_error"`.
    kind: &'static str,
    /// The store primitive (`"claim"`, `"get"`, `"takeover"`, `"mark_unknown"`, `"complete"`,
    /// `"release"`, `"renew"`, or in transactional mode `"commit"`) for `"store"`.
    op: Option<&'static str>,
    /// Positional arguments of the store primitive, in the store method's order.
    #[pyo3(get)]
    args: Py<PyTuple>,
    /// HTTP status for `"respond"`.
    #[pyo3(get)]
    status: Option<u16>,
    /// Header pairs for `"respond"` (None: an empty list, made when read).
    headers: Option<Py<PyList>>,
    /// Body for `"respond"`.
    #[pyo3(get)]
    body: Option<Py<PyBytes>>,
    /// How the request ended (`"respond"`, `"propagate_error"`), e.g. `"replayed"`.
    outcome: Option<&'static str>,
    /// Whether the handler ran in this flow (`"respond"`, `"propagate_error"`).
    #[pyo3(get)]
    handler_ran: bool,
    /// The fencing token of this execution (`"run_handler"`).
    #[pyo3(get)]
    token: Option<Py<PyBytes>>,
    /// The record generation (`"run_handler"`).
    #[pyo3(get)]
    generation: Option<u32>,
    /// Key for downstream side effects, stable across takeovers (`"run_handler"`).
    #[pyo3(get)]
    downstream_key: Option<String>,
    /// Heartbeat interval while the handler runs (`"run_handler"`).
    #[pyo3(get)]
    heartbeat_ms: Option<u64>,
}

#[pymethods]
impl Action {
    /// `"store"`, `"run_handler"`, `"wait"`, `"lease_lost"`, `"respond"` or `"propagate_error"`.
    #[getter]
    fn kind<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        name(py, self.kind)
    }

    /// The store primitive (`"claim"`, `"get"`, `"takeover"`, `"mark_unknown"`, `"complete"`,
    /// `"release"`, `"renew"`, or in transactional mode `"commit"`) for `"store"`.
    #[getter]
    fn op<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyString>> {
        self.op.map(|op| name(py, op))
    }

    /// Header pairs for `"respond"` (empty for the other kinds).
    #[getter]
    fn headers(&self, py: Python<'_>) -> Py<PyList> {
        self.headers
            .as_ref()
            .map_or_else(|| PyList::empty(py).unbind(), |h| h.clone_ref(py))
    }

    /// Sets a `"respond"` action's answer into `fields` (the `__dict__` of a new
    /// `idempo._flow.Response`), in its fields' order: `status`, `headers` (a new list of the
    /// pairs), `body`, `outcome` (`""` when none), `handler_ran`; what reading each attribute
    /// would give, in one call. `AssertionError` for any other action (nothing is set).
    fn fill_response(&self, py: Python<'_>, fields: &Bound<'_, PyDict>) -> PyResult<()> {
        let (Some(status), Some(body), "respond") = (self.status, &self.body, self.kind) else {
            return Err(PyAssertionError::new_err(format!(
                "not a response: Action({})",
                self.kind
            )));
        };
        let headers = match &self.headers {
            Some(h) => PyList::new(py, h.bind(py).iter())?,
            None => PyList::empty(py),
        };
        fields.set_item(intern!(py, "status"), status)?;
        fields.set_item(intern!(py, "headers"), headers)?;
        fields.set_item(intern!(py, "body"), body.bind(py))?;
        let outcome = self
            .outcome
            .map_or_else(|| intern!(py, "").clone(), |o| name(py, o));
        fields.set_item(intern!(py, "outcome"), outcome)?;
        fields.set_item(intern!(py, "handler_ran"), self.handler_ran)?;
        Ok(())
    }

    /// How the request ended (`"respond"`, `"propagate_error"`), e.g. `"replayed"`.
    #[getter]
    fn outcome<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyString>> {
        self.outcome.map(|outcome| name(py, outcome))
    }

    fn __repr__(&self) -> String {
        match (self.kind, self.op, self.status, self.outcome) {
            ("store", Some(op), _, _) => format!("Action(store {op})"),
            ("respond", _, Some(s), Some(o)) => format!("Action(respond {s}, outcome={o})"),
            (k, _, _, _) => format!("Action({k})"),
        }
    }
}

fn blank(py: Python<'_>, kind: &'static str) -> Action {
    Action {
        kind,
        op: None,
        args: PyTuple::empty(py).unbind(),
        status: None,
        headers: None,
        body: None,
        outcome: None,
        handler_ran: false,
        token: None,
        generation: None,
        downstream_key: None,
        heartbeat_ms: None,
    }
}

pub(crate) fn respond(
    py: Python<'_>,
    r: &HttpResponse,
    outcome: Option<&'static str>,
    ran: bool,
) -> PyResult<Action> {
    let headers = PyList::empty(py);
    for (n, v) in &r.headers {
        headers.append((header_name(py, n), v.as_str()))?;
    }
    let mut a = blank(py, "respond");
    a.status = Some(r.status);
    a.headers = Some(headers.unbind());
    a.body = Some(PyBytes::new(py, &r.body).unbind());
    a.outcome = outcome;
    a.handler_ran = ran;
    Ok(a)
}

/// Every item of `list` is a `(str, str)` tuple, exactly (what [`respond`] would make of them).
fn str_pairs(list: &Bound<'_, PyList>) -> bool {
    list.iter().all(|item| {
        item.cast_exact::<PyTuple>().is_ok_and(|pair| {
            pair.len() == 2
                && pair
                    .iter()
                    .all(|part| part.cast_exact::<PyString>().is_ok())
        })
    })
}

fn store_action(py: Python<'_>, op: &StoreOp) -> PyResult<Action> {
    let mut a = blank(py, "store");
    let key = |s: &ScopeId| PyBytes::new(py, s.as_bytes()).into_any();
    let tok = |t: &FencingToken| PyBytes::new(py, t.as_bytes()).into_any();
    let (name, args) = match op {
        StoreOp::Claim {
            scope,
            fingerprint,
            token,
            lease_ms,
            ttl_ms,
        } => (
            "claim",
            PyTuple::new(
                py,
                [
                    key(scope),
                    PyString::new(py, fingerprint.as_str()).into_any(),
                    tok(token),
                    lease_ms.into_pyobject(py)?.into_any(),
                    ttl_ms.into_pyobject(py)?.into_any(),
                ],
            )?,
        ),
        StoreOp::Get { scope } => ("get", PyTuple::new(py, [key(scope)])?),
        StoreOp::TakeOver {
            scope,
            seen_token,
            new_token,
            lease_ms,
        } => (
            "takeover",
            PyTuple::new(
                py,
                [
                    key(scope),
                    tok(seen_token),
                    tok(new_token),
                    lease_ms.into_pyobject(py)?.into_any(),
                ],
            )?,
        ),
        StoreOp::MarkUnknown {
            scope,
            seen_token,
            ttl_ms,
        } => (
            "mark_unknown",
            PyTuple::new(
                py,
                [
                    key(scope),
                    tok(seen_token),
                    ttl_ms.into_pyobject(py)?.into_any(),
                ],
            )?,
        ),
        StoreOp::Complete {
            scope,
            token,
            response,
            ttl_ms,
        } => (
            "complete",
            PyTuple::new(
                py,
                [
                    key(scope),
                    tok(token),
                    PyBytes::new(py, response).into_any(),
                    ttl_ms.into_pyobject(py)?.into_any(),
                ],
            )?,
        ),
        StoreOp::Release { scope, token } => {
            ("release", PyTuple::new(py, [key(scope), tok(token)])?)
        }
        StoreOp::Renew {
            scope,
            token,
            lease_ms,
        } => (
            "renew",
            PyTuple::new(
                py,
                [
                    key(scope),
                    tok(token),
                    lease_ms.into_pyobject(py)?.into_any(),
                ],
            )?,
        ),
        StoreOp::Commit { scope } => ("commit", PyTuple::new(py, [key(scope)])?),
    };
    a.op = Some(name);
    a.args = args.unbind();
    Ok(a)
}

fn to_action(py: Python<'_>, action: &CoreAction) -> PyResult<Action> {
    match action {
        CoreAction::Store(op) => store_action(py, op),
        CoreAction::RunHandler(run) => {
            let mut a = blank(py, "run_handler");
            a.token = Some(PyBytes::new(py, run.token.as_bytes()).unbind());
            a.generation = Some(run.generation);
            a.downstream_key = Some(run.downstream_key.as_str().to_owned());
            a.heartbeat_ms = run.heartbeat_ms;
            Ok(a)
        }
        CoreAction::Wait => Ok(blank(py, "wait")),
        CoreAction::LeaseLost => Ok(blank(py, "lease_lost")),
        CoreAction::Respond { response, outcome } => {
            respond(py, response, Some(outcome.as_str()), outcome.handler_ran())
        }
        CoreAction::PropagateError { outcome } => {
            let mut a = blank(py, "propagate_error");
            a.outcome = Some(outcome.as_str());
            a.handler_ran = outcome.handler_ran();
            Ok(a)
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pending {
    Claim,
    Get,
    TakeOver,
    MarkUnknown,
    Complete,
    Release,
    Renew,
    Commit,
    Nothing,
}

impl Pending {
    fn name(self) -> &'static str {
        match self {
            Self::Claim => "claim",
            Self::Get => "get",
            Self::TakeOver => "takeover",
            Self::MarkUnknown => "mark_unknown",
            Self::Complete => "complete",
            Self::Release => "release",
            Self::Renew => "renew",
            Self::Commit => "commit",
            Self::Nothing => "",
        }
    }
}

fn pending_of(action: &CoreAction) -> Pending {
    match action {
        CoreAction::Store(StoreOp::Claim { .. }) => Pending::Claim,
        CoreAction::Store(StoreOp::Get { .. }) => Pending::Get,
        CoreAction::Store(StoreOp::TakeOver { .. }) => Pending::TakeOver,
        CoreAction::Store(StoreOp::MarkUnknown { .. }) => Pending::MarkUnknown,
        CoreAction::Store(StoreOp::Complete { .. }) => Pending::Complete,
        CoreAction::Store(StoreOp::Release { .. }) => Pending::Release,
        CoreAction::Store(StoreOp::Renew { .. }) => Pending::Renew,
        CoreAction::Store(StoreOp::Commit { .. }) => Pending::Commit,
        _ => Pending::Nothing,
    }
}

/// A record from a store's `StoredRecord` (attributes named as the contract's columns).
fn record_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Result<Record, String>> {
    let row = RecordRow {
        fingerprint: obj.getattr("fingerprint")?.extract()?,
        state: obj.getattr("state")?.extract()?,
        token: obj.getattr("token")?.extract()?,
        generation: obj.getattr("generation")?.extract()?,
        lease_until_ms: obj.getattr("lease_until")?.extract()?,
        expires_at_ms: obj.getattr("expires_at")?.extract()?,
        response: obj.getattr("response")?.extract()?,
    };
    Ok(Record::from_row(row).map_err(|e| e.to_string()))
}

/// `idempo.stores.Claimed` and `idempo.stores.Existing` (imported at their first claim result).
static CLAIMED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static EXISTING: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// The server flow for one request with a valid key.
#[pyclass(module = "idempo._idempo")]
pub(crate) struct ServerFlow {
    inner: CoreFlow,
    pending: Pending,
    corrupt: Option<String>,
}

impl ServerFlow {
    /// Core's next action after `event`.
    fn advance(&mut self, py: Python<'_>, event: Event) -> PyResult<CoreAction> {
        self.inner.handle(event).map_err(|e| {
            let code = match e {
                FlowError::Finished => "finished",
                _ => "unexpected_event",
            };
            invalid_argument(py, e.to_string(), code)
        })
    }

    /// `action` for the host, after running on `memory` the store operations it executes
    /// inline ([`InlineMemory::run`]) and feeding their results; the first one it hands back
    /// (or any other action) goes to the host.
    fn settle(
        &mut self,
        py: Python<'_>,
        action: CoreAction,
        memory: Option<&Bound<'_, InlineMemory>>,
    ) -> PyResult<Action> {
        let action = self.settle_core(py, action, memory)?;
        to_action(py, &action)
    }

    /// [`settle`](Self::settle) before the action is made a Python object.
    fn settle_core(
        &mut self,
        py: Python<'_>,
        mut action: CoreAction,
        memory: Option<&Bound<'_, InlineMemory>>,
    ) -> PyResult<CoreAction> {
        if let Some(memory) = memory {
            while let CoreAction::Store(op) = &action {
                let Some(result) = memory.get().run(py, op) else {
                    break;
                };
                action = self.advance(py, Event::Store(result))?;
            }
        }
        self.pending = pending_of(&action);
        Ok(action)
    }

    fn feed(&mut self, py: Python<'_>, event: Event) -> PyResult<Action> {
        self.feed_inline(py, event, None)
    }

    fn feed_inline(
        &mut self,
        py: Python<'_>,
        event: Event,
        memory: Option<&Bound<'_, InlineMemory>>,
    ) -> PyResult<Action> {
        let action = self.advance(py, event)?;
        self.settle(py, action, memory)
    }
}

#[pymethods]
impl ServerFlow {
    /// Starts a flow; returns it with its first action (always a claim).
    ///
    /// With `config.transactional` the host runs the flow's store operations and the handler's
    /// writes in one database transaction (core's transactional mode: no heartbeat, `"release"`
    /// is the rollback, `"commit"` asked for where the outcome is kept).
    ///
    /// With `memory` (an `InlineMemory` of the request's `MemoryStore`), the store operations
    /// it runs inline are executed within this call (and within `handler_finished` and
    /// `handler_failed` given it); the action returned is the first one it does not run.
    #[staticmethod]
    #[pyo3(signature = (scope, fingerprint, config, entropy, memory = None))]
    fn start(
        py: Python<'_>,
        scope: &[u8],
        fingerprint: &Bound<'_, PyString>,
        config: &Config,
        entropy: &[u8],
        memory: Option<&Bound<'_, InlineMemory>>,
    ) -> PyResult<(Self, Action)> {
        let scope =
            ScopeId::try_from(scope).map_err(|e| invalid_argument(py, e.to_string(), e.code()))?;
        let fingerprint = FingerprintText::new(fingerprint.to_cow()?.into_owned())
            .map_err(|e| invalid_argument(py, e.to_string(), "invalid_fingerprint"))?;
        let entropy = <[u8; 16]>::try_from(entropy).map_err(|_| {
            invalid_argument(py, "entropy must be 16 bytes".to_owned(), "invalid_entropy")
        })?;
        let (inner, first) =
            CoreFlow::start(scope, fingerprint, Arc::clone(&config.inner), entropy);
        let mut flow = Self {
            inner,
            pending: pending_of(&first),
            corrupt: None,
        };
        let action = flow.settle(py, first, memory)?;
        Ok((flow, action))
    }

    /// Feeds the return value of the store primitive the last action asked for.
    ///
    /// A record that violates the storage contract is treated as a store failure (fail closed);
    /// `corrupt_record` then says why.
    fn store_result(&mut self, py: Python<'_>, result: &Bound<'_, PyAny>) -> PyResult<Action> {
        let op = self.pending;
        self.store_event(py, op.name(), result)
    }

    /// Feeds the result of the named store primitive (`"claim"`, `"get"`, `"takeover"`,
    /// `"mark_unknown"`, `"complete"`, `"release"`, `"renew"`, `"commit"`: its result is
    /// ignored, success is all it reports); a result core does not expect now is refused with
    /// `InvalidArgument` code `"unexpected_event"`.
    fn store_event(
        &mut self,
        py: Python<'_>,
        op: &str,
        result: &Bound<'_, PyAny>,
    ) -> PyResult<Action> {
        let event = match op {
            "claim" => {
                let now_ms: u64 = result.getattr(intern!(py, "now_ms"))?.extract()?;
                // idempo's own result classes are known by their type; any other result by the
                // attributes it has (the probes of a missing attribute cost an exception each).
                let kind = result.get_type();
                let is = |cell: &'static PyOnceLock<Py<PyType>>, name: &str| {
                    cell.import(py, "idempo.stores._base", name)
                        .is_ok_and(|t| kind.is(t))
                };
                let claimed = is(&CLAIMED, "Claimed");
                let existing = !claimed && is(&EXISTING, "Existing");
                if !claimed
                    && !existing
                    && result.hasattr(intern!(py, "locked"))?
                    && result.getattr(intern!(py, "locked"))?.is_truthy()?
                {
                    // idempo.stores.Locked: the lock wait timed out (spec/PROTOCOL.md §7.6).
                    Event::Store(StoreResult::Locked { now_ms })
                } else if existing || (!claimed && result.hasattr(intern!(py, "record"))?) {
                    match record_from_py(&result.getattr(intern!(py, "record"))?)? {
                        Ok(record) => Event::Store(StoreResult::Existing { record, now_ms }),
                        Err(why) => {
                            self.corrupt = Some(why);
                            Event::StoreFailed
                        }
                    }
                } else {
                    let generation: u32 = result.getattr(intern!(py, "generation"))?.extract()?;
                    Event::Store(StoreResult::Claimed { generation, now_ms })
                }
            }
            "get" => {
                let (record, now_ms): (Bound<'_, PyAny>, u64) = result.extract()?;
                if record.is_none() {
                    Event::Store(StoreResult::Got {
                        record: None,
                        now_ms,
                    })
                } else {
                    match record_from_py(&record)? {
                        Ok(r) => Event::Store(StoreResult::Got {
                            record: Some(r),
                            now_ms,
                        }),
                        Err(why) => {
                            self.corrupt = Some(why);
                            Event::StoreFailed
                        }
                    }
                }
            }
            "takeover" => Event::Store(StoreResult::TookOver(result.extract()?)),
            "mark_unknown" => Event::Store(StoreResult::MarkedUnknown(result.extract()?)),
            "complete" => Event::Store(StoreResult::Completed(result.extract()?)),
            "release" => Event::Store(StoreResult::Released(result.extract()?)),
            "renew" => Event::Store(StoreResult::Renewed(result.extract()?)),
            "commit" => Event::Store(StoreResult::Committed),
            _ => {
                return Err(invalid_argument(
                    py,
                    format!("no store operation {op:?} is pending"),
                    "unexpected_event",
                ));
            }
        };
        self.feed(py, event)
    }

    /// The pending store primitive failed (error, timeout): fail closed.
    fn store_failed(&mut self, py: Python<'_>) -> PyResult<Action> {
        self.feed(py, Event::StoreFailed)
    }

    /// The handler returned a response. `body_to_store` is the redaction hook's output;
    /// `framework=True` when the framework rejected the request before the handler ran (never
    /// stored); `body_truncated=True` when the host stopped recording the body at the capture
    /// limit (`BodyCapture`), so the record becomes the response-not-retained problem.
    /// `memory`: as for `start`. (The options may be passed by position too: a call without
    /// keywords costs no dictionary.)
    #[pyo3(signature = (status, headers, body, body_to_store = None, framework = false, body_truncated = false, memory = None))]
    #[allow(clippy::too_many_arguments)]
    fn handler_finished(
        &mut self,
        py: Python<'_>,
        status: u16,
        headers: &Bound<'_, PyAny>,
        body: &Bound<'_, PyAny>,
        body_to_store: Option<&Bound<'_, PyAny>>,
        framework: bool,
        body_truncated: bool,
        memory: Option<&Bound<'_, InlineMemory>>,
    ) -> PyResult<Action> {
        let given = (headers, body);
        let headers = header_pairs(Some(given.0))?;
        // The handler's own pairs, for an answer that is exactly the handler's response.
        let pairs = headers.clone();
        let body = with_bytes(body, <[u8]>::to_vec)?;
        let body_to_store = match body_to_store {
            Some(b) if !b.is_none() => Some(with_bytes(b, <[u8]>::to_vec)?),
            _ => None,
        };
        let event = Event::HandlerFinished(HandlerResponse {
            status,
            headers,
            body,
            body_to_store,
            origin: if framework {
                ResponseOrigin::Framework
            } else {
                ResponseOrigin::Handler
            },
            body_truncated,
        });
        let action = self.advance(py, event)?;
        let action = self.settle_core(py, action, memory)?;
        if let CoreAction::Respond { response, outcome } = &action {
            // Core answers with the handler's own response: its answer is made of the
            // handler's header list and body objects (equal values, no copies).
            if let (Ok(list), Ok(bytes)) = (
                given.0.cast_exact::<PyList>(),
                given.1.cast_exact::<PyBytes>(),
            ) {
                if response.status == status
                    && response.headers == pairs
                    && response.body.as_slice() == bytes.as_bytes()
                    && str_pairs(list)
                {
                    let mut a = blank(py, "respond");
                    a.status = Some(status);
                    a.headers = Some(list.clone().unbind());
                    a.body = Some(bytes.clone().unbind());
                    a.outcome = Some(outcome.as_str());
                    a.handler_ran = outcome.handler_ran();
                    return Ok(a);
                }
            }
        }
        to_action(py, &action)
    }

    /// The handler raised. `maybe_side_effect=False` only when it certainly did nothing.
    /// `memory`: as for `start`.
    #[pyo3(signature = (maybe_side_effect = true, *, memory = None))]
    fn handler_failed(
        &mut self,
        py: Python<'_>,
        maybe_side_effect: bool,
        memory: Option<&Bound<'_, InlineMemory>>,
    ) -> PyResult<Action> {
        self.feed_inline(py, Event::HandlerFailed { maybe_side_effect }, memory)
    }

    /// The heartbeat timer fired while the handler runs.
    fn heartbeat_due(&mut self, py: Python<'_>) -> PyResult<Action> {
        self.feed(py, Event::HeartbeatDue)
    }

    /// This flow's fencing token.
    #[getter]
    fn token<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.inner.token().as_bytes())
    }

    /// The generation owned, once claimed or taken over.
    #[getter]
    fn generation(&self) -> Option<u32> {
        self.inner.generation()
    }

    /// True once the flow answered.
    #[getter]
    fn finished(&self) -> bool {
        self.inner.is_finished()
    }

    /// Why the last record read was refused as corrupt, if it was.
    #[getter]
    fn corrupt_record(&self) -> Option<String> {
        self.corrupt.clone()
    }

    /// Once finished: the background cleanup to run after answering (a claim or takeover whose
    /// answer was lost may have been applied), or `None`.
    #[getter]
    fn cleanup(&self, py: Python<'_>) -> PyResult<Option<Cleanup>> {
        self.inner
            .cleanup()
            .map(|c| {
                Ok(Cleanup {
                    inner: c.clone(),
                    action: Py::new(py, store_action(py, c.op())?)?,
                })
            })
            .transpose()
    }
}

/// The background cleanup of a claim or takeover whose answer was lost (core's `Cleanup`).
///
/// Run [`action`](Cleanup::action) (a `"release"` or `"renew"` store action) after the
/// response is sent, never blocking the request and never raising; after each attempt ask
/// [`next`](Cleanup::next) how long to wait before the next one (`None`: stop).
#[pyclass(frozen, module = "idempo._idempo")]
pub(crate) struct Cleanup {
    inner: CoreCleanup,
    action: Py<Action>,
}

#[pymethods]
impl Cleanup {
    /// The token-fenced store action to run (kind `"store"`, op `"release"` or `"renew"`).
    #[getter]
    fn action(&self, py: Python<'_>) -> Py<Action> {
        self.action.clone_ref(py)
    }

    /// Retries continue while the next attempt starts within this many ms of the first (the
    /// route's `cleanup_budget_ms` or its lease, whichever is longer).
    #[getter]
    fn budget_ms(&self) -> u64 {
        self.inner.budget_ms()
    }

    /// The largest delay in ms between two attempts (2000, or half the lease when shorter).
    #[getter]
    fn max_delay_ms(&self) -> u64 {
        self.inner.max_delay_ms()
    }

    /// The delay in ms before the next attempt, or `None` to stop, after attempt number
    /// `attempt` (0 first) ended `elapsed_ms` after the first attempt started; `applied` is the
    /// store primitive's boolean result, or `None` when it raised.
    #[pyo3(signature = (attempt, elapsed_ms, applied))]
    fn next(&self, attempt: u32, elapsed_ms: u64, applied: Option<bool>) -> Option<u64> {
        let event = match (applied, self.inner.op()) {
            (None, _) => Event::StoreFailed,
            (Some(ok), StoreOp::Renew { .. }) => Event::Store(StoreResult::Renewed(ok)),
            (Some(ok), _) => Event::Store(StoreResult::Released(ok)),
        };
        match self.inner.next(attempt, elapsed_ms, &event) {
            CleanupStep::RetryAfter(ms) => Some(ms),
            CleanupStep::Done => None,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Cleanup({}, budget_ms={}, max_delay_ms={})",
            match self.inner.op() {
                StoreOp::Renew { .. } => "renew",
                _ => "release",
            },
            self.inner.budget_ms(),
            self.inner.max_delay_ms()
        )
    }
}

/// The problem answer (400 or 413, chosen by core) for a body that could not be fingerprinted:
/// the `problem` a `CanonicalizationError` raised by idempo carries.
#[pyfunction]
pub(crate) fn body_problem(py: Python<'_>, error: &Bound<'_, PyAny>) -> PyResult<Py<Action>> {
    if !error.is_instance_of::<CanonicalizationError>() {
        return Err(invalid_argument(
            py,
            "body_problem expects a CanonicalizationError".to_owned(),
            "invalid_argument",
        ));
    }
    let problem = error.getattr("problem").ok();
    match problem.as_ref().map(|p| p.cast::<Action>()) {
        Some(Ok(action)) => Ok(action.clone().unbind()),
        _ => Err(invalid_argument(
            py,
            "this CanonicalizationError was not raised by idempo (it carries no problem)"
                .to_owned(),
            "invalid_argument",
        )),
    }
}

/// The 503 problem answer for a failure before the flow could start (e.g. the store could not
/// be reached to read the key's record).
#[pyfunction]
pub(crate) fn unavailable_problem(py: Python<'_>, config: &Config) -> PyResult<Action> {
    let resp = problem_response(
        ProblemKind::StoreUnavailable,
        None,
        None,
        Some(config.inner.unavailable_retry_after_ms.get()),
    );
    respond(py, &resp, Some("store_unavailable"), false)
}

/// The `response` column bytes (versioned core encoding) of a stored response.
#[pyfunction]
pub(crate) fn encode_response<'py>(
    py: Python<'py>,
    status: u16,
    headers: &Bound<'py, PyAny>,
    body: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let stored = StoredResponse {
        status,
        headers: header_pairs(Some(headers))?,
        body: with_bytes(body, <[u8]>::to_vec)?,
    };
    match stored.encode() {
        Ok(bytes) => Ok(PyBytes::new(py, &bytes)),
        Err(e) => Err(invalid_argument(py, e.to_string(), "unencodable_response")),
    }
}

/// A decoded stored response as Python receives it: `(status, headers, body)`.
type DecodedResponse<'py> = (u16, Vec<(String, String)>, Bound<'py, PyBytes>);

/// `(status, headers, body)` from `response` column bytes; `RecordCorrupt` when they are not
/// a response this build understands.
#[pyfunction]
pub(crate) fn decode_response<'py>(py: Python<'py>, data: &[u8]) -> PyResult<DecodedResponse<'py>> {
    match StoredResponse::decode(data) {
        Ok(r) => Ok((r.status, r.headers, PyBytes::new(py, &r.body))),
        Err(e) => Err(PyErr::new::<crate::errors::RecordCorrupt, _>(e.to_string())),
    }
}
