//! Canonical JSON, fingerprints, keys, scopes and the retry policy: thin wrappers over core.

use idempo_core::canonical::{self, CanonOptions, Limits, NumberMode};
use idempo_core::fingerprint::{
    FingerprintConfig, Fingerprinter as CoreFingerprinter, RequestParts,
    RouteFingerprinter as CoreRouteFingerprinter,
};
use idempo_core::key::{self, IdempotencyKey, KeyOptions};
use idempo_core::retry::{self, AttemptOutcome, Jitter, RetryConfig, RetryDecision, StopReason};
use idempo_core::scope::ScopeId;
use idempo_core::vocab::AttemptKind;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyBytes, PyString};
use std::sync::{Arc, Mutex, OnceLock};

use crate::convert::{DETACH_THRESHOLD, header_pairs, strings, text, with_bytes};
use crate::errors::{canon_error, fingerprint_error, invalid_argument, key_error};

// The Python signatures spell the key length defaults out (so stubs can check them).
const _: () = assert!(key::DEFAULT_MIN_LEN == 8 && key::DEFAULT_MAX_LEN == 128);

/// Core's number mode named `numbers` (core's vocabulary), or `default` when None.
fn number_mode(py: Python<'_>, numbers: Option<&str>, default: NumberMode) -> PyResult<NumberMode> {
    numbers.map_or(Ok(default), |n| {
        n.parse::<NumberMode>()
            .map_err(|e| invalid_argument(py, e.to_string(), "invalid_number_mode"))
    })
}

fn limits(
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

/// A prepared fingerprint configuration (keep one per route on hot paths).
#[pyclass(frozen, module = "idempo._idempo")]
pub(crate) struct Fingerprinter {
    inner: Arc<CoreFingerprinter>,
    header_names: Vec<String>,
}

impl Fingerprinter {
    /// Core's prepared fingerprinter (for admission).
    pub(crate) fn core(&self) -> &CoreFingerprinter {
        &self.inner
    }
}

#[pymethods]
impl Fingerprinter {
    #[new]
    #[pyo3(signature = (*, header_names = None, exclude = None, hmac_key = None, numbers = None, max_input_bytes = None, max_depth = None, max_members = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        header_names: Option<&Bound<'_, PyAny>>,
        exclude: Option<&Bound<'_, PyAny>>,
        hmac_key: Option<Vec<u8>>,
        numbers: Option<&str>,
        max_input_bytes: Option<usize>,
        max_depth: Option<usize>,
        max_members: Option<usize>,
    ) -> PyResult<Self> {
        let header_names = strings(header_names)?;
        let config = FingerprintConfig {
            header_names: header_names.clone(),
            exclude: strings(exclude)?,
            numbers: number_mode(py, numbers, FingerprintConfig::default().numbers)?,
            limits: limits(max_input_bytes, max_depth, max_members),
            hmac_key,
        };
        let inner = CoreFingerprinter::new(&config).map_err(|e| fingerprint_error(py, &e))?;
        Ok(Self {
            inner: Arc::new(inner),
            header_names,
        })
    }

    /// The header names that take part in the fingerprint.
    #[getter]
    fn header_names(&self) -> Vec<String> {
        self.header_names.clone()
    }

    /// This configuration bound to one (method, route template) for JSON bodies: the per-route hot
    /// path, where only the body crosses into native code on each call. Needs a fingerprinter
    /// without header names (their values differ per request).
    fn for_route(
        &self,
        method: &Bound<'_, PyString>,
        route: &Bound<'_, PyString>,
    ) -> PyResult<RouteFingerprinter> {
        if !self.header_names.is_empty() {
            return Err(PyTypeError::new_err(
                "for_route() needs a Fingerprinter without header_names",
            ));
        }
        let (method, route) = (method.to_cow()?.into_owned(), route.to_cow()?.into_owned());
        Ok(RouteFingerprinter {
            inner: self.inner.for_route(&method, &route),
            method,
            route,
        })
    }

    /// Fingerprint of one request (`v1:<hex>` or, with an HMAC key, `h1:<hex>`).
    #[pyo3(signature = (method, route, body, headers = None, content_type = ContentTypeArg::Json))]
    fn fingerprint<'py>(
        &self,
        py: Python<'py>,
        method: &Bound<'py, PyString>,
        route: &Bound<'py, PyString>,
        body: &Bound<'py, PyAny>,
        headers: Option<&Bound<'py, PyAny>>,
        content_type: ContentTypeArg,
    ) -> PyResult<Bound<'py, PyString>> {
        let pairs = header_pairs(headers)?;
        compute(
            py,
            &self.inner,
            method,
            route,
            body,
            &pairs,
            content_type.as_deref(),
        )
    }
}

/// A [`Fingerprinter`] bound to one method and route template (JSON bodies, no header names).
#[pyclass(frozen, module = "idempo._idempo")]
pub(crate) struct RouteFingerprinter {
    inner: CoreRouteFingerprinter,
    method: String,
    route: String,
}

#[pymethods]
impl RouteFingerprinter {
    /// The method this fingerprinter is bound to.
    #[getter]
    fn method(&self) -> &str {
        &self.method
    }

    /// The route template this fingerprinter is bound to.
    #[getter]
    fn route(&self) -> &str {
        &self.route
    }

    /// Fingerprint of a JSON body sent to this route.
    fn fingerprint<'py>(
        &self,
        py: Python<'py>,
        body: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyString>> {
        let result = with_bytes(body, |body| {
            if body.len() >= DETACH_THRESHOLD {
                py.detach(|| self.inner.fingerprint_json(body))
            } else {
                self.inner.fingerprint_json(body)
            }
        })?;
        match result {
            Ok(f) => Ok(PyString::new(py, f.text().as_str())),
            Err(e) => Err(fingerprint_error(py, &e)),
        }
    }

    /// Same as [`RouteFingerprinter::fingerprint`].
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        body: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyString>> {
        self.fingerprint(py, body)
    }

    fn __repr__(&self) -> String {
        format!("RouteFingerprinter({:?}, {:?})", self.method, self.route)
    }
}

/// The `content_type` argument: left out means `application/json` (no allocation on the hot
/// path); `None` means the request has no content type.
pub(crate) enum ContentTypeArg {
    Json,
    Absent,
    Given(PyBackedStr),
}

impl ContentTypeArg {
    fn as_deref(&self) -> Option<&str> {
        match self {
            Self::Json => Some("application/json"),
            Self::Absent => None,
            Self::Given(text) => Some(text),
        }
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for ContentTypeArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_none() {
            return Ok(Self::Absent);
        }
        match obj.extract() {
            Ok(text) => Ok(Self::Given(text)),
            Err(_) => Err(PyTypeError::new_err(format!(
                "content_type must be str or None, got {}",
                obj.get_type().name()?
            ))),
        }
    }
}

fn compute<'py>(
    py: Python<'py>,
    fp: &CoreFingerprinter,
    method: &Bound<'py, PyString>,
    route: &Bound<'py, PyString>,
    body: &Bound<'py, PyAny>,
    pairs: &[(String, String)],
    content_type: Option<&str>,
) -> PyResult<Bound<'py, PyString>> {
    // UTF-8 bytes owned by Python (no Rust copy); `to_cow` would copy under the 3.9 stable ABI.
    let method = method.encode_utf8()?;
    let route = route.encode_utf8()?;
    let (Ok(method), Ok(route)) = (
        std::str::from_utf8(method.as_bytes()),
        std::str::from_utf8(route.as_bytes()),
    ) else {
        return Err(PyTypeError::new_err("method and route must be valid text"));
    };
    let borrowed: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let result = with_bytes(body, |body| {
        let parts = RequestParts {
            method,
            route,
            headers: &borrowed,
            content_type,
            body,
        };
        if body.len() >= DETACH_THRESHOLD {
            py.detach(|| fp.fingerprint(&parts))
        } else {
            fp.fingerprint(&parts)
        }
    })?;
    match result {
        Ok(f) => Ok(PyString::new(py, f.text().as_str())),
        Err(e) => Err(fingerprint_error(py, &e)),
    }
}

/// Route-bound fingerprinters for the all-defaults `fingerprint()` call, keyed by the identity
/// of its method and route string objects (frameworks pass the same constant objects on every
/// request): a hit skips reading both strings and computing the framing head.
struct RouteCache {
    entries: Mutex<Vec<RouteEntry>>,
}

struct RouteEntry {
    /// Strong references: the objects stay alive, so their identity cannot be reused.
    method: Py<PyString>,
    route: Py<PyString>,
    bound: CoreRouteFingerprinter,
}

/// How many (method, route) objects the cache keeps; past that, new pairs take the plain path.
const ROUTE_CACHE_SIZE: usize = 32;

static ROUTES: RouteCache = RouteCache {
    entries: Mutex::new(Vec::new()),
};

impl RouteCache {
    /// The fingerprint through a kept route binding, or `None` when the caller must take the
    /// plain path (a body large enough to release the GIL for, the cache busy in another
    /// thread, or full).
    fn fingerprint<'py>(
        &self,
        py: Python<'py>,
        fp: &Arc<CoreFingerprinter>,
        method: &Bound<'py, PyString>,
        route: &Bound<'py, PyString>,
        body: &Bound<'py, PyAny>,
    ) -> Option<PyResult<Bound<'py, PyString>>> {
        // Never hold the lock while the GIL is released.
        if body
            .cast::<PyBytes>()
            .is_ok_and(|b| b.as_bytes().len() >= DETACH_THRESHOLD)
        {
            return None;
        }
        let mut entries = self.entries.try_lock().ok()?;
        let found = entries.iter().position(|e| {
            e.method.as_ptr() == method.as_ptr() && e.route.as_ptr() == route.as_ptr()
        });
        let index = match found {
            Some(i) => i,
            None if entries.len() < ROUTE_CACHE_SIZE => {
                let (Ok(m), Ok(r)) = (method.to_cow(), route.to_cow()) else {
                    return None;
                };
                entries.push(RouteEntry {
                    method: method.clone().unbind(),
                    route: route.clone().unbind(),
                    bound: fp.for_route(&m, &r),
                });
                entries.len() - 1
            }
            None => return None,
        };
        let bound = &entries[index].bound;
        // A large body is left to the plain path, which releases the GIL for it (never with
        // this lock held).
        let result = match with_bytes(body, |body| {
            (body.len() < DETACH_THRESHOLD).then(|| bound.fingerprint_json(body))
        }) {
            Ok(r) => r?,
            Err(e) => return Some(Err(e)),
        };
        Some(match result {
            Ok(f) => Ok(PyString::new(py, f.text().as_str())),
            Err(e) => Err(fingerprint_error(py, &e)),
        })
    }
}

/// Fingerprint of one request. `headers` (a mapping or `(name, value)` pairs) all take part.
#[pyfunction]
#[pyo3(signature = (method, route, body, headers = None, exclude = None, content_type = ContentTypeArg::Json, hmac_key = None, numbers = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fingerprint<'py>(
    py: Python<'py>,
    method: &Bound<'py, PyString>,
    route: &Bound<'py, PyString>,
    body: &Bound<'py, PyAny>,
    headers: Option<&Bound<'py, PyAny>>,
    exclude: Option<&Bound<'py, PyAny>>,
    content_type: ContentTypeArg,
    hmac_key: Option<Vec<u8>>,
    numbers: Option<&str>,
) -> PyResult<Bound<'py, PyString>> {
    let pairs = header_pairs(headers)?;
    let exclude = strings(exclude)?;
    let numbers = number_mode(py, numbers, FingerprintConfig::default().numbers)?;
    // The all-defaults call (the common one) reuses one prepared configuration.
    if pairs.is_empty()
        && exclude.is_empty()
        && hmac_key.is_none()
        && numbers == FingerprintConfig::default().numbers
    {
        static DEFAULT: OnceLock<Arc<CoreFingerprinter>> = OnceLock::new();
        let fp = match DEFAULT.get() {
            Some(fp) => fp,
            None => {
                let fp = CoreFingerprinter::new(&FingerprintConfig::default())
                    .map_err(|e| fingerprint_error(py, &e))?;
                DEFAULT.get_or_init(|| Arc::new(fp))
            }
        };
        if matches!(content_type, ContentTypeArg::Json)
            && let Some(answer) = ROUTES.fingerprint(py, fp, method, route, body)
        {
            return answer;
        }
        return compute(py, fp, method, route, body, &pairs, content_type.as_deref());
    }
    let config = FingerprintConfig {
        header_names: pairs.iter().map(|(n, _)| n.clone()).collect(),
        exclude,
        numbers,
        limits: Limits::default(),
        hmac_key,
    };
    let fp = CoreFingerprinter::new(&config).map_err(|e| fingerprint_error(py, &e))?;
    compute(
        py,
        &fp,
        method,
        route,
        body,
        &pairs,
        content_type.as_deref(),
    )
}

fn key_options(
    py: Python<'_>,
    strict: bool,
    min_len: usize,
    max_len: usize,
) -> PyResult<KeyOptions> {
    KeyOptions::new(min_len, max_len)
        .map(|o| o.with_strict(strict))
        .map_err(|e| invalid_argument(py, e.to_string(), e.code()))
}

/// Parses an `Idempotency-Key` header value (sf-string or bare token) into the key text.
#[pyfunction]
#[pyo3(signature = (value, *, strict = false, min_len = 8, max_len = 128))]
pub(crate) fn parse_key(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    strict: bool,
    min_len: usize,
    max_len: usize,
) -> PyResult<String> {
    let opts = key_options(py, strict, min_len, max_len)?;
    let parsed = with_bytes(value, |raw| key::parse_key_bytes(raw, &opts))?;
    parsed
        .map(|k| k.as_str().to_owned())
        .map_err(|e| key_error(py, &e))
}

/// Parses a header value and also reports how it was written:
/// `(key, form, ignored_parameters, canonical_header_value)`.
#[pyfunction]
#[pyo3(signature = (value, *, strict = false, min_len = 8, max_len = 128))]
pub(crate) fn parse_key_details(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    strict: bool,
    min_len: usize,
    max_len: usize,
) -> PyResult<(String, &'static str, usize, String)> {
    let opts = key_options(py, strict, min_len, max_len)?;
    let parsed = with_bytes(value, |raw| key::parse_key_detailed(raw, &opts))?;
    parsed
        .map(|p| {
            (
                p.key.as_str().to_owned(),
                p.form.as_str(),
                p.ignored_parameters,
                p.key.to_header_value(),
            )
        })
        .map_err(|e| key_error(py, &e))
}

/// The sf-string header value (`"..."`) that carries `key`.
#[pyfunction]
pub(crate) fn key_header_value(py: Python<'_>, key: &Bound<'_, PyString>) -> PyResult<String> {
    let opts = key_options(py, false, 1, key::MAX_LEN_LIMIT)?;
    IdempotencyKey::from_text(&key.to_cow()?, &opts)
        .map(|k| k.to_header_value())
        .map_err(|e| key_error(py, &e))
}

/// A fresh key (UUIDv4 shape) from 16 bytes of entropy: `os.urandom(16)` unless given.
#[pyfunction]
#[pyo3(signature = (entropy = None))]
pub(crate) fn generate_key(py: Python<'_>, entropy: Option<Vec<u8>>) -> PyResult<String> {
    let entropy = match entropy {
        Some(bytes) => <[u8; 16]>::try_from(bytes.as_slice()).map_err(|_| {
            invalid_argument(py, "entropy must be 16 bytes".to_owned(), "invalid_entropy")
        })?,
        None => urandom16(py)?,
    };
    Ok(IdempotencyKey::generate(entropy).as_str().to_owned())
}

/// 16 bytes from `os.urandom` (the host's entropy source).
pub(crate) fn urandom16(py: Python<'_>) -> PyResult<[u8; 16]> {
    let raw: Vec<u8> = py.import("os")?.call_method1("urandom", (16,))?.extract()?;
    <[u8; 16]>::try_from(raw.as_slice())
        .map_err(|_| PyTypeError::new_err("os.urandom(16) did not return 16 bytes"))
}

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
