//! Core's staged request admission (`idempo_core::machine::admit`, `spec/PROTOCOL.md` §7.2.1),
//! for Python hosts.
//!
//! An [`Admission`] holds the stage core's types allow next; each method feeds one stage and
//! refuses (with `InvalidArgument`) a call out of order, so a host cannot skip or reorder a
//! check. The host only reads the key fields, the body and the scope function's return value.
use idempo_core::fingerprint::RequestParts;
use idempo_core::machine::admit::{
    self as core_admit, AwaitingBody, AwaitingScope, BodyRead, BodyStage, KeyStage, Refusal,
    ScopeResolution, ScopeRule as CoreScopeRule, ScopeStage,
};
use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyFrozenSet, PyString};

use crate::asgi_headers::scan;
use crate::convert::header_pairs;
use crate::errors::invalid_argument;
use crate::fingerprint::Fingerprinter;
use crate::flow::{Action, Config, respond};

/// What a route declares about its scope (principal), validated: a scope function, or
/// `public=True` (keys shared by every caller), or neither (shared, with a warning for
/// authenticated requests); `empty_scope_is_anonymous=True` accepts an empty principal from the
/// function as the anonymous one.
#[pyclass(frozen, module = "idempo._idempo")]
pub(crate) struct ScopeRule {
    inner: CoreScopeRule,
}

#[pymethods]
impl ScopeRule {
    #[new]
    #[pyo3(signature = (*, function, public = false, empty_scope_is_anonymous = false))]
    fn new(
        py: Python<'_>,
        function: bool,
        public: bool,
        empty_scope_is_anonymous: bool,
    ) -> PyResult<Self> {
        CoreScopeRule::new(function, public, empty_scope_is_anonymous)
            .map(|inner| Self { inner })
            .map_err(|e| invalid_argument(py, e.to_string(), "invalid_scope_rule"))
    }

    /// Whether the route has a scope function (the host calls it).
    #[getter]
    fn function(&self) -> bool {
        matches!(self.inner, CoreScopeRule::Function { .. })
    }
}

/// What [`Admission::admit`] returns once admitted: `(key, scope_id, fingerprint, partition,
/// warning)`.
type Admitted<'py> = (
    Bound<'py, PyString>,
    Bound<'py, PyBytes>,
    Bound<'py, PyString>,
    Bound<'py, PyBytes>,
    Option<String>,
);

enum Stage {
    Body(AwaitingBody),
    Scope(AwaitingScope),
    Done,
}

/// One request's admission (see the module docs).
///
/// `kind` is `"pass_through"` (run the handler unprotected), `"refuse"` (send `problem`; log
/// `log` when set), `"read_body"` (read at most `body_limit` bytes, then call `body`),
/// `"resolve_scope"` (call the scope function when `rule.function`, then `scope`) or
/// `"admitted"` (`key`, `scope_id`, `fingerprint`, `partition` are set; emit `warning` when set).
#[pyclass(module = "idempo._idempo")]
pub(crate) struct Admission {
    stage: Stage,
    kind: &'static str,
    #[pyo3(get)]
    problem: Option<Py<Action>>,
    #[pyo3(get)]
    log: Option<String>,
    #[pyo3(get)]
    warning: Option<String>,
    #[pyo3(get)]
    body_limit: Option<usize>,
    #[pyo3(get)]
    key: Option<String>,
    #[pyo3(get)]
    scope_id: Option<Py<PyBytes>>,
    #[pyo3(get)]
    fingerprint: Option<String>,
    /// The principal's quota partition (8 bytes), for a store with per-partition quotas.
    #[pyo3(get)]
    partition: Option<Py<PyBytes>>,
    /// `start_asgi`: an `authorization` header came with the request.
    #[pyo3(get)]
    authorization: bool,
    /// `start_asgi`: the fingerprinted header pairs and the `content-type` it read, for `body`
    /// and `admit` called without theirs.
    read: Option<ReadHeaders>,
}

/// What `start_asgi` read for stage 2: the fingerprinted header pairs and the `content-type`.
type ReadHeaders = (Vec<(String, String)>, Option<String>);

impl Admission {
    fn refused(&mut self, py: Python<'_>, r: &Refusal) -> PyResult<()> {
        self.stage = Stage::Done;
        self.kind = "refuse";
        self.log.clone_from(&r.log);
        self.problem = Some(Py::new(
            py,
            respond(py, &r.response, Some(r.outcome()), false)?,
        )?);
        Ok(())
    }

    /// What a scope function gave: its return value, or its exception's text
    /// (`"{type(exc).__name__}: {exc}"`) when it raised an `Exception` (anything else, e.g. a
    /// cancellation, propagates).
    fn call_scope<'py>(
        py: Python<'py>,
        function: &Bound<'py, PyAny>,
        argument: &Bound<'py, PyAny>,
    ) -> PyResult<Result<Bound<'py, PyAny>, String>> {
        match function.call1((argument,)) {
            Ok(v) => Ok(Ok(v)),
            Err(e) if e.is_instance_of::<PyException>(py) => {
                let name = e.get_type(py).name()?;
                let text = e.value(py).str()?;
                Ok(Err(format!("{}: {}", name.to_cow()?, text.to_cow()?)))
            }
            Err(e) => Err(e),
        }
    }

    /// Stage 1 on the key fields and the declared length.
    fn started(
        py: Python<'_>,
        config: &Config,
        key_fields: &[Vec<u8>],
        declared_length: Option<u64>,
    ) -> PyResult<Self> {
        let fields: Vec<&[u8]> = key_fields.iter().map(Vec::as_slice).collect();
        let mut a = Self {
            stage: Stage::Done,
            kind: "pass_through",
            problem: None,
            log: None,
            warning: None,
            body_limit: None,
            key: None,
            scope_id: None,
            fingerprint: None,
            partition: None,
            authorization: false,
            read: None,
        };
        match core_admit::admit(&config.inner, &fields, declared_length) {
            KeyStage::PassThrough => {}
            KeyStage::Refuse(r) => a.refused(py, &r)?,
            KeyStage::Continue(w) => {
                a.kind = "read_body";
                a.body_limit = Some(w.body_limit());
                a.key = Some(w.key().as_str().to_owned());
                a.stage = Stage::Body(w);
            }
        }
        Ok(a)
    }

    fn out_of_order(py: Python<'_>, call: &str, kind: &str) -> PyErr {
        invalid_argument(
            py,
            format!("Admission.{call}() called in stage {kind:?}"),
            "admission_order",
        )
    }
}

#[pymethods]
impl Admission {
    /// Stage 1: the raw `Idempotency-Key` field values (bytes, in order; empty: no key) and the
    /// declared body length (`Content-Length`, None when unknown).
    #[staticmethod]
    #[pyo3(signature = (config, key_fields, declared_length = None))]
    fn start(
        py: Python<'_>,
        config: &Config,
        key_fields: Vec<Vec<u8>>,
        declared_length: Option<u64>,
    ) -> PyResult<Self> {
        Self::started(py, config, &key_fields, declared_length)
    }

    /// Stage 1 from an ASGI request's raw headers (a list of `(name, value)` tuples of
    /// `bytes`), read in one pass as `idempo._host.request_headers(raw, key_name,
    /// fingerprinted)` and `declared_length` read them: the fields of the key header
    /// `key_name` (lowercase), the last `content-length`, and, kept for `body` and `admit`
    /// called without theirs, the pairs of the headers named in `fingerprinted` (lowercase) and
    /// the last `content-type`; `authorization` tells whether that header came. None when the
    /// headers have another shape (not all `bytes`) or the `content-length` is not ASCII
    /// digits within 64 bits: the host reads them itself and calls `start`.
    #[staticmethod]
    fn start_asgi(
        py: Python<'_>,
        config: &Config,
        raw: &Bound<'_, PyAny>,
        key_name: &[u8],
        fingerprinted: &Bound<'_, PyFrozenSet>,
    ) -> PyResult<Option<Self>> {
        let Some(read) = scan(raw, key_name, fingerprinted)? else {
            return Ok(None);
        };
        let mut a = Self::started(py, config, &read.key_fields, read.declared_length)?;
        a.authorization = read.authorization;
        a.read = Some((read.pairs, read.content_type));
        Ok(Some(a))
    }

    /// Stage 2: the body as read (`over_limit=True` when the host stopped reading past
    /// `body_limit`; `body` is then ignored) with the route's fingerprinter, the method, the
    /// concrete request target (path and query), the header pairs and the `Content-Type`.
    /// Without `headers`, an admission from `start_asgi` takes the pairs it read, and its
    /// `content-type` unless `content_type` is given.
    #[pyo3(signature = (fingerprinter, method, target, body, headers = None, content_type = None, *, over_limit = false))]
    #[allow(clippy::too_many_arguments)]
    fn body(
        &mut self,
        py: Python<'_>,
        fingerprinter: &Fingerprinter,
        method: &Bound<'_, PyString>,
        target: &Bound<'_, PyString>,
        body: &[u8],
        headers: Option<&Bound<'_, PyAny>>,
        content_type: Option<&str>,
        over_limit: bool,
    ) -> PyResult<()> {
        let Stage::Body(w) = std::mem::replace(&mut self.stage, Stage::Done) else {
            return Err(Self::out_of_order(py, "body", self.kind));
        };
        let (pairs, read_type) = match (headers, self.read.take()) {
            (Some(h), _) => (header_pairs(Some(h))?, None),
            (None, Some((pairs, content_type))) => (pairs, content_type),
            (None, None) => (Vec::new(), None),
        };
        let content_type = content_type.or(read_type.as_deref());
        let borrowed: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let (method, target) = (method.to_cow()?, target.to_cow()?);
        let read = if over_limit {
            BodyRead::OverLimit {
                read: u64::try_from(body.len()).unwrap_or(u64::MAX),
            }
        } else {
            BodyRead::Complete(RequestParts {
                method: &method,
                route: &target,
                headers: &borrowed,
                content_type,
                body,
            })
        };
        match w
            .body(read, fingerprinter.core())
            .map_err(|e| invalid_argument(py, e.to_string(), "fingerprint_failed"))?
        {
            BodyStage::Refuse(r) => self.refused(py, &r)?,
            BodyStage::Continue(s) => {
                self.kind = "resolve_scope";
                self.fingerprint = Some(s.fingerprint().as_str().to_owned());
                self.stage = Stage::Scope(s);
            }
        }
        Ok(())
    }

    /// Stage 3: what the route's scope function gave (`returned`, or `raised`: the exception's
    /// text) under `rule`, whether the request is authenticated, the method and the route
    /// template. Without a function, pass neither.
    #[pyo3(signature = (rule, method, route, *, authenticated, returned = None, raised = None))]
    #[allow(clippy::too_many_arguments)]
    fn scope(
        &mut self,
        py: Python<'_>,
        rule: &ScopeRule,
        method: &str,
        route: &str,
        authenticated: bool,
        returned: Option<&Bound<'_, PyAny>>,
        raised: Option<&str>,
    ) -> PyResult<()> {
        let Stage::Scope(s) = std::mem::replace(&mut self.stage, Stage::Done) else {
            return Err(Self::out_of_order(py, "scope", self.kind));
        };
        let principal;
        let described;
        let resolution = match (raised, returned) {
            (Some(msg), _) => ScopeResolution::Raised(msg),
            (None, _) if !matches!(rule.inner, CoreScopeRule::Function { .. }) => {
                ScopeResolution::NotCalled
            }
            (None, None) => ScopeResolution::Nothing("None"),
            (None, Some(v)) if v.is_none() => ScopeResolution::Nothing("None"),
            (None, Some(v)) => match v.cast::<PyString>() {
                Ok(text) => {
                    principal = text.to_cow()?.into_owned();
                    ScopeResolution::Principal(&principal)
                }
                Err(_) => {
                    described = format!("{} {}", v.get_type().name()?, v.repr()?);
                    ScopeResolution::NotAString(&described)
                }
            },
        };
        match s.scope(rule.inner, resolution, authenticated, method, route) {
            ScopeStage::Refuse(r) => self.refused(py, &r)?,
            ScopeStage::Admitted(a) => {
                self.kind = "admitted";
                self.key = Some(a.key.as_str().to_owned());
                self.scope_id = Some(PyBytes::new(py, a.scope.as_bytes()).unbind());
                self.partition = Some(PyBytes::new(py, a.partition.as_bytes()).unbind());
                self.fingerprint = Some(a.fingerprint.as_str().to_owned());
                self.warning = a.warning;
            }
        }
        Ok(())
    }

    /// Stages 2 and 3 in one call, as `body` then (when the body passed) `scope` would run
    /// them: the body and its fingerprint, then the scope, calling `scope_function(scope_argument)`
    /// only once the body passed and only when `rule.function` (a raised `Exception` is the
    /// `raised` of `scope`). Returns `(key, scope_id, fingerprint, partition, warning)` once
    /// admitted, or None when refused (`problem` and `log` are set, as by the stage that
    /// refused).
    ///
    /// Every argument may be passed by position (a host's call per request then builds no
    /// keyword dictionary); `authenticated` is required all the same.
    #[pyo3(signature = (fingerprinter, rule, method, target, route, body, headers = None, content_type = None, over_limit = false, authenticated = None, scope_function = None, scope_argument = None))]
    #[allow(clippy::too_many_arguments)]
    fn admit<'py>(
        &mut self,
        py: Python<'py>,
        fingerprinter: &Fingerprinter,
        rule: &ScopeRule,
        method: &Bound<'py, PyString>,
        target: &Bound<'py, PyString>,
        route: &str,
        body: &[u8],
        headers: Option<&Bound<'py, PyAny>>,
        content_type: Option<&str>,
        over_limit: bool,
        authenticated: Option<bool>,
        scope_function: Option<&Bound<'py, PyAny>>,
        scope_argument: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Admitted<'py>>> {
        let Some(authenticated) = authenticated else {
            return Err(PyTypeError::new_err(
                "Admission.admit() missing required argument: 'authenticated'",
            ));
        };
        self.body(
            py,
            fingerprinter,
            method,
            target,
            body,
            headers,
            content_type,
            over_limit,
        )?;
        if !matches!(self.stage, Stage::Scope(_)) {
            return Ok(None);
        }
        let method = method.to_cow()?;
        let called = match (
            scope_function,
            matches!(rule.inner, CoreScopeRule::Function { .. }),
        ) {
            (Some(function), true) => {
                let none = py.None().into_bound(py);
                Some(Self::call_scope(
                    py,
                    function,
                    scope_argument.unwrap_or(&none),
                )?)
            }
            _ => None,
        };
        match &called {
            Some(Ok(returned)) => {
                self.scope(
                    py,
                    rule,
                    &method,
                    route,
                    authenticated,
                    Some(returned),
                    None,
                )?;
            }
            Some(Err(raised)) => {
                self.scope(py, rule, &method, route, authenticated, None, Some(raised))?;
            }
            None => self.scope(py, rule, &method, route, authenticated, None, None)?,
        }
        let (Some(key), Some(scope_id), Some(fingerprint), Some(partition)) = (
            self.key.as_deref(),
            self.scope_id.as_ref(),
            self.fingerprint.as_deref(),
            self.partition.as_ref(),
        ) else {
            return Ok(None);
        };
        if self.kind != "admitted" {
            return Ok(None);
        }
        Ok(Some((
            PyString::new(py, key),
            scope_id.bind(py).clone(),
            PyString::new(py, fingerprint),
            partition.bind(py).clone(),
            self.warning.clone(),
        )))
    }

    /// The stage (see the type's docs).
    #[getter(kind)]
    fn kind_name<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        crate::names::name(py, self.kind)
    }

    fn __repr__(&self) -> String {
        format!("Admission({})", self.kind)
    }
}
