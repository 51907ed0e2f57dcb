//! Idempotent function calls (core's `machine::call`), for `idempo.functions`.
//!
//! Translation only: core fixes a call's scope and fingerprint framing, how a result or a raised
//! error is fed to the flow, and what the flow's final action means for the caller.

use idempo_core::machine::HttpResponse;
use idempo_core::machine::call::{
    self, CallAnswer as CoreAnswer, CallError, ErrorDisposition, outcome_named,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::convert::{header_pairs, with_bytes};
use crate::errors::invalid_argument;

fn call_error(py: Python<'_>, e: &CallError) -> PyErr {
    invalid_argument(py, e.to_string(), e.code())
}

/// One idempotent function (core's `Call`): its name is the route of its calls.
#[pyclass(frozen, module = "idempo._idempo")]
pub(crate) struct Call {
    inner: call::Call,
}

#[pymethods]
impl Call {
    #[new]
    fn new(py: Python<'_>, name: &str) -> PyResult<Self> {
        let inner = call::Call::new(name).map_err(|e| call_error(py, &e))?;
        Ok(Self { inner })
    }

    /// The function's name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// The 32-byte record scope of `key` for `principal` (`""`: none).
    fn scope<'py>(
        &self,
        py: Python<'py>,
        principal: &str,
        key: &str,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let scope = self
            .inner
            .scope(principal, key)
            .map_err(|e| call_error(py, &e))?;
        Ok(PyBytes::new(py, scope.as_bytes()))
    }

    /// The fingerprint text of `payload` (JSON bytes) under `fingerprinter` (an
    /// `idempo.Fingerprinter`: its exclusions, numbers and HMAC key apply).
    fn fingerprint(
        &self,
        fingerprinter: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<String> {
        let parts = with_bytes(payload, |b| {
            let p = self.inner.parts(b);
            (
                p.method.to_owned(),
                p.route.to_owned(),
                p.content_type.map(str::to_owned),
            )
        })?;
        let kwargs = PyDict::new(fingerprinter.py());
        kwargs.set_item("content_type", parts.2)?;
        fingerprinter
            .call_method("fingerprint", (parts.0, parts.1, payload), Some(&kwargs))?
            .extract()
    }
}

/// `(status, headers, body)` to pass to `ServerFlow.handler_finished` for a returned result.
#[pyfunction]
pub(crate) fn call_returned<'py>(
    py: Python<'py>,
    serializer: &str,
    body: Vec<u8>,
) -> PyResult<(u16, Bound<'py, PyList>, Bound<'py, PyBytes>)> {
    let event = call::returned(serializer, body).map_err(|e| call_error(py, &e))?;
    match event {
        idempo_core::machine::Event::HandlerFinished(r) => {
            finished(py, r.status, &r.headers, &r.body)
        }
        _ => Err(invalid_argument(py, "unexpected event".into(), "internal")),
    }
}

fn finished<'py>(
    py: Python<'py>,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
) -> PyResult<(u16, Bound<'py, PyList>, Bound<'py, PyBytes>)> {
    let list = PyList::empty(py);
    for (n, v) in headers {
        list.append((n.as_str(), v.as_str()))?;
    }
    Ok((status, list, PyBytes::new(py, body)))
}

/// What to feed the flow for an error raised under `disposition` (`"store"`, `"release"`,
/// `"unknown"`): `("finished", status, headers, body)` for `ServerFlow.handler_finished`, or
/// `("failed", maybe_side_effect)` for `ServerFlow.handler_failed`.
#[pyfunction]
pub(crate) fn call_raised<'py>(
    py: Python<'py>,
    disposition: &str,
    body: Vec<u8>,
) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
    let Some(d) = ErrorDisposition::named(disposition) else {
        return Err(invalid_argument(
            py,
            format!(
                "error disposition {disposition:?} must be \"store\", \"release\" or \"unknown\""
            ),
            "bad_disposition",
        ));
    };
    match call::raised(d, body) {
        idempo_core::machine::Event::HandlerFinished(r) => {
            let (s, h, b) = finished(py, r.status, &r.headers, &r.body)?;
            pyo3::types::PyTuple::new(
                py,
                [
                    "finished".into_pyobject(py)?.into_any(),
                    s.into_pyobject(py)?.into_any(),
                    h.into_any(),
                    b.into_any(),
                ],
            )
        }
        idempo_core::machine::Event::HandlerFailed { maybe_side_effect } => {
            pyo3::types::PyTuple::new(
                py,
                [
                    "failed".into_pyobject(py)?.into_any(),
                    pyo3::types::PyBool::new(py, maybe_side_effect)
                        .to_owned()
                        .into_any(),
                ],
            )
        }
        _ => Err(invalid_argument(py, "unexpected event".into(), "internal")),
    }
}

/// What the caller of a function gets, read from the flow's final action.
#[pyclass(frozen, module = "idempo._idempo", get_all)]
pub(crate) struct CallAnswer {
    /// `"returned"`, `"stored_error"`, `"propagate"`, `"not_retained"`, `"in_flight"`,
    /// `"mismatch"`, `"outcome_unknown"`, `"unavailable"` or `"foreign"`.
    kind: &'static str,
    /// The serializer that encoded the result (`"returned"`).
    serializer: Option<String>,
    /// The encoded result or error (`"returned"`, `"stored_error"`).
    body: Option<Py<PyBytes>>,
    /// True when read from the record: this call did not run the function.
    replayed: bool,
    /// Milliseconds to wait before retrying (`"in_flight"`, `"unavailable"`).
    retry_after_ms: Option<u64>,
    /// How the flow ended (core's outcome name).
    outcome: String,
    /// The record's status (`"foreign"`).
    status: Option<u16>,
}

/// The answer of a flow's final `action` (`"respond"` or `"propagate_error"`).
#[pyfunction]
pub(crate) fn call_answer(py: Python<'_>, action: &Bound<'_, PyAny>) -> PyResult<CallAnswer> {
    let outcome_text: String = action
        .getattr("outcome")?
        .extract::<Option<String>>()?
        .unwrap_or_default();
    let Some(outcome) = outcome_named(&outcome_text) else {
        return Err(invalid_argument(
            py,
            format!("the action has no known outcome ({outcome_text:?})"),
            "unexpected_action",
        ));
    };
    let kind: String = action.getattr("kind")?.extract()?;
    let answer = if kind == "propagate_error" {
        CoreAnswer::Propagate
    } else {
        let status: u16 = action
            .getattr("status")?
            .extract::<Option<u16>>()?
            .unwrap_or(0);
        let headers = header_pairs(Some(&action.getattr("headers")?))?;
        let body: Vec<u8> = action
            .getattr("body")?
            .extract::<Option<Vec<u8>>>()?
            .unwrap_or_default();
        CoreAnswer::of_response(
            &HttpResponse {
                status,
                headers,
                body,
            },
            outcome,
        )
    };
    let flat = answer.into_flat();
    let out = CallAnswer {
        kind: flat.kind,
        serializer: flat.serializer,
        body: flat.body.map(|b| PyBytes::new(py, &b).unbind()),
        replayed: flat.replayed,
        retry_after_ms: flat.retry_after_ms,
        outcome: outcome_text,
        status: flat.status,
    };
    Ok(out)
}

/// Core's bounded, jittered pause before poll `attempt` of a call in flight, or None once the
/// budget is spent (`jitter`: 0..=65535 from the host's randomness).
#[pyfunction]
pub(crate) fn call_wait_delay(
    attempt: u32,
    retry_after_ms: u64,
    elapsed_ms: u64,
    budget_ms: u64,
    jitter: u16,
) -> Option<u64> {
    call::wait_delay(attempt, retry_after_ms, elapsed_ms, budget_ms, jitter)
}

/// Registers this module's classes and functions.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Call>()?;
    m.add_class::<CallAnswer>()?;
    m.add_function(wrap_pyfunction!(call_returned, m)?)?;
    m.add_function(wrap_pyfunction!(call_raised, m)?)?;
    m.add_function(wrap_pyfunction!(call_answer, m)?)?;
    m.add_function(wrap_pyfunction!(call_wait_delay, m)?)?;
    Ok(())
}
