//! Request fingerprints (`idempo_core::fingerprint`) for Python: `Fingerprinter`,
//! `RouteFingerprinter` and the one-call `fingerprint`.

use idempo_core::canonical::Limits;
use idempo_core::fingerprint::{
    FingerprintConfig, Fingerprinter as CoreFingerprinter, RequestParts,
    RouteFingerprinter as CoreRouteFingerprinter,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyBytes, PyString};
use std::sync::{Arc, Mutex, OnceLock};

use crate::canonical::{limits, number_mode};
use crate::convert::{DETACH_THRESHOLD, header_pairs, strings, with_bytes};
use crate::errors::fingerprint_error;

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
