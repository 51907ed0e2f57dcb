//! The client's retry policy (`idempo_core::retry`) for Python.

use idempo_core::retry::{self, AttemptOutcome, Jitter, RetryConfig, RetryDecision, StopReason};
use idempo_core::vocab::AttemptKind;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::convert::text;
use crate::errors::invalid_argument;

/// What the client should do after one attempt.
#[pyclass(frozen, module = "idempo._idempo", get_all)]
pub(crate) struct RetryAdvice {
    /// True: wait `delay_ms`, then resend with the same key.
    retry: bool,
    /// Milliseconds to wait (retry only).
    delay_ms: Option<u64>,
    /// Why to stop (stop only): a stable code such as `"success"` or `"attempts_exhausted"`.
    reason: Option<&'static str>,
    /// The status behind a `client_error` or `server_error_not_retryable` stop.
    status: Option<u16>,
    /// Stop only: whether the stop settles a pending intent (its record is removed) or leaves
    /// the key pending (core's `StopReason::settles_intent`, `spec/KEYS.md` §3.6). False for a
    /// retry.
    settles_intent: bool,
}

#[pymethods]
impl RetryAdvice {
    fn __repr__(&self) -> String {
        match (self.retry, self.delay_ms, self.reason) {
            (true, Some(d), _) => format!("RetryAdvice(retry=True, delay_ms={d})"),
            (_, _, Some(r)) => format!("RetryAdvice(retry=False, reason={r:?})"),
            _ => "RetryAdvice()".to_owned(),
        }
    }
}

/// The client retry policy of core (exponential backoff with jitter, `Retry-After`, budgets).
#[pyclass(frozen, module = "idempo._idempo")]
pub(crate) struct RetryPolicy {
    inner: retry::RetryPolicy,
}

#[pymethods]
impl RetryPolicy {
    #[new]
    #[pyo3(signature = (*, max_attempts = 5, base_delay_ms = 500, max_delay_ms = 10_000, max_elapsed_ms = 60_000, jitter = "equal"))]
    fn new(
        py: Python<'_>,
        max_attempts: u32,
        base_delay_ms: u64,
        max_delay_ms: u64,
        max_elapsed_ms: u64,
        jitter: &str,
    ) -> PyResult<Self> {
        let jitter = jitter
            .parse::<Jitter>()
            .map_err(|e| invalid_argument(py, e.to_string(), "invalid_jitter_mode"))?;
        let inner = retry::RetryPolicy::new(RetryConfig {
            max_attempts,
            base_delay_ms,
            max_delay_ms,
            max_elapsed_ms,
            jitter,
        })
        .map_err(|e| invalid_argument(py, e.to_string(), e.code()))?;
        Ok(Self { inner })
    }

    /// Attempts in all, the first included.
    #[getter]
    fn max_attempts(&self) -> u32 {
        self.inner.config().max_attempts
    }

    /// Total time budget in ms.
    #[getter]
    fn max_elapsed_ms(&self) -> u64 {
        self.inner.config().max_elapsed_ms
    }

    /// Decides after attempt `attempt` (1-based), `elapsed_ms` after the first attempt started.
    ///
    /// `outcome` is an HTTP status (int), `"timeout"`, `"connection_error"`,
    /// `"outcome_unknown"`, `"key_reused"`, `"in_flight"` or `"response_not_retained"`;
    /// `retry_after_ms` is the response's `Retry-After` already converted (see
    /// `parse_retry_after`); `jitter` is a uniform sample in [0, 1) from the host. For a status,
    /// `content_type` and `body` let core tell idempo's own problems (409 in-flight, 422
    /// key-reused, 500 outcome-unknown and response-not-retained) from the application's
    /// answers; the body matters only when `response_body_needed` is true.
    #[pyo3(signature = (attempt, elapsed_ms, outcome, jitter, retry_after_ms = None, *, content_type = None, body = None))]
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &self,
        py: Python<'_>,
        attempt: u32,
        elapsed_ms: u64,
        outcome: &Bound<'_, PyAny>,
        jitter: f64,
        retry_after_ms: Option<u64>,
        content_type: Option<&str>,
        body: Option<&[u8]>,
    ) -> PyResult<RetryAdvice> {
        let outcome = if let Ok(s) = outcome.cast::<PyString>() {
            let text = s.to_cow()?;
            // Core's vocabulary: every attempt kind but `response` (a status is passed instead).
            match text
                .parse::<AttemptKind>()
                .ok()
                .and_then(|kind| kind.outcome(retry_after_ms))
            {
                Some(outcome) => outcome,
                None => {
                    return Err(invalid_argument(
                        py,
                        format!(
                            "outcome must be a status or one of {}, got {text:?}",
                            AttemptKind::names()[1..].join(", ")
                        ),
                        "invalid_outcome",
                    ));
                }
            }
        } else {
            let status: u16 = outcome.extract()?;
            AttemptOutcome::from_response(status, retry_after_ms, content_type, body.unwrap_or(&[]))
        };
        let decision = self
            .inner
            .decide(attempt, elapsed_ms, &outcome, jitter)
            .map_err(|e| invalid_argument(py, e.to_string(), e.code()))?;
        Ok(match decision {
            RetryDecision::Retry { delay_ms } => RetryAdvice {
                retry: true,
                delay_ms: Some(delay_ms),
                reason: None,
                status: None,
                settles_intent: false,
            },
            RetryDecision::Stop { reason } => RetryAdvice {
                retry: false,
                delay_ms: None,
                reason: Some(reason.code()),
                status: match reason {
                    StopReason::ClientError { status }
                    | StopReason::ServerErrorNotRetryable { status } => Some(status),
                    _ => None,
                },
                settles_intent: reason.settles_intent(),
            },
        })
    }
}

/// Whether core looks at the body of a response with this status and `Content-Type` to
/// recognise idempo's own problems (a 409, 422 or 500 `application/problem+json`): a client reads
/// a streamed body only then and passes it to `RetryPolicy.decide(..., body=...)`.
#[pyfunction]
#[pyo3(signature = (status, content_type = None))]
pub(crate) fn response_body_needed(status: u16, content_type: Option<&str>) -> bool {
    AttemptOutcome::body_needed(status, content_type)
}

/// A `Retry-After` value (delta-seconds or HTTP-date) as milliseconds from `now_ms`.
#[pyfunction]
pub(crate) fn parse_retry_after(value: &Bound<'_, PyAny>, now_ms: u64) -> PyResult<Option<u64>> {
    let value = text(value)?;
    Ok(retry::parse_retry_after(&value, now_ms))
}
