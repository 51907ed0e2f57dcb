//! Request fingerprints (`v1:` SHA-256 or `h1:` HMAC-SHA256 over core's framing).
use idempo_core::fingerprint::Fingerprint;
use idempo_core::fingerprint::{self as fp, FingerprintConfig, FingerprintError, RequestParts};
use napi::bindgen_prelude::{Buffer, External};
use std::sync::Arc;

use napi::{Env, JsString};
use napi_derive::napi;

use crate::canonical::{canon_fail, limits, number_mode};
use crate::error::{Fail, code};
use crate::strarg::{STACK_STR, StrArg};

/// The fingerprint text as a JS string, formatted by core on the stack (no heap allocation).
fn text<'e>(env: &'e Env, f: &Fingerprint) -> napi::Result<JsString<'e>> {
    // Fingerprint text is ASCII, so latin1 and UTF-8 agree (latin1 is the cheaper copy).
    env.create_string_latin1(f.text().as_bytes())
}

/// Fingerprint settings. Every service sharing a store must use the same ones.
#[napi(object)]
#[derive(Default)]
pub struct FingerprinterOptions {
    /// Header names that take part (case-insensitive). Default: none.
    pub header_names: Option<Vec<String>>,
    /// RFC 6901 pointers of JSON values left out. Default: none.
    pub exclude: Option<Vec<String>>,
    /// `"reject_precision_loss"` (default) or `"rfc"`.
    pub numbers: Option<String>,
    /// HMAC key: fingerprints become `h1:` HMAC-SHA256. Must not be empty.
    pub hmac_key: Option<Buffer>,
    /// Maximum JSON body size in bytes (default 8 MiB).
    pub max_input_bytes: Option<u32>,
    /// Maximum JSON nesting depth (default 128).
    pub max_depth: Option<u32>,
    /// Maximum JSON members and elements (default 100000).
    pub max_members: Option<u32>,
}

pub(crate) fn fingerprint_fail(e: &FingerprintError) -> Fail {
    match e {
        FingerprintError::Body(c) => canon_fail(c),
        other => Fail::new(code::FINGERPRINT, other.to_string()).reason(other.code()),
    }
}

fn config(o: FingerprinterOptions) -> Result<FingerprintConfig, Fail> {
    let d = FingerprintConfig::default();
    Ok(FingerprintConfig {
        header_names: o.header_names.unwrap_or_default(),
        exclude: o.exclude.unwrap_or_default(),
        numbers: number_mode(o.numbers.as_deref())?.unwrap_or(d.numbers),
        limits: limits(o.max_input_bytes, o.max_depth, o.max_members),
        hmac_key: o.hmac_key.map(|b| b.to_vec()),
    })
}

/// A prepared fingerprint configuration (pointers compiled, HMAC key schedule computed once).
#[napi]
pub struct Fingerprinter {
    inner: Arc<fp::Fingerprinter>,
    uses_headers: bool,
}

#[napi]
impl Fingerprinter {
    /// Validates and prepares the settings (throws `FINGERPRINT_ERROR` or `INVALID_ARGUMENT`).
    #[napi(constructor, catch_unwind)]
    pub fn new(env: Env, options: Option<FingerprinterOptions>) -> napi::Result<Self> {
        let cfg = config(options.unwrap_or_default()).map_err(|f| f.throw(&env))?;
        let inner = fp::Fingerprinter::new(&cfg).map_err(|e| fingerprint_fail(&e).throw(&env))?;
        Ok(Self {
            inner: Arc::new(inner),
            uses_headers: !cfg.header_names.is_empty(),
        })
    }

    /// True when configured header names take part (the caller must then pass the headers).
    #[napi(getter)]
    #[must_use]
    pub fn uses_headers(&self) -> bool {
        self.uses_headers
    }

    /// The fingerprint text of one request. `headers` is a flat `[name, value, name, value, ...]`
    /// list (only read when header names are configured); `contentType` null means none.
    /// A JSON body that is not acceptable throws `CANONICALIZATION_ERROR`.
    #[napi(catch_unwind)]
    pub fn fingerprint(
        &self,
        env: Env,
        method: String,
        route: String,
        body: &[u8],
        content_type: Option<String>,
        headers: Option<Vec<String>>,
    ) -> napi::Result<String> {
        let flat = headers.unwrap_or_default();
        let pairs: Vec<(&str, &str)> = flat
            .chunks_exact(2)
            .map(|c| (c[0].as_str(), c[1].as_str()))
            .collect();
        let parts = RequestParts {
            method: &method,
            route: &route,
            headers: &pairs,
            content_type: content_type.as_deref(),
            body,
        };
        self.inner
            .fingerprint(&parts)
            .map(|f| f.to_string())
            .map_err(|e| fingerprint_fail(&e).throw(&env))
    }

    /// The fingerprint of a JSON request without configured headers: the hot path (strings read
    /// into stack buffers, the body borrowed from the `Uint8Array`, the result created as a JS
    /// string directly: no heap allocation in the binding).
    #[napi(catch_unwind)]
    pub fn fingerprint_json<'e>(
        &self,
        env: &'e Env,
        method: JsString<'_>,
        route: JsString<'_>,
        body: &[u8],
    ) -> napi::Result<JsString<'e>> {
        json_text(env, &self.inner, &method, &route, body)
    }

    /// This configuration as an opaque handle for [`fingerprint_json_with`]: a plain function
    /// call on a handle costs less per call than a method call on a class instance.
    #[napi(catch_unwind, ts_return_type = "ExternalObject<'FingerprinterHandle'>")]
    #[must_use]
    pub fn handle(&self) -> External<Arc<fp::Fingerprinter>> {
        External::new(Arc::clone(&self.inner))
    }

    /// A fingerprinter bound to one (method, route template): the per-route hot path, where
    /// only the body crosses into native code on each call.
    #[napi(catch_unwind)]
    #[must_use]
    pub fn for_route(&self, method: String, route: String) -> RouteFingerprinter {
        RouteFingerprinter {
            inner: self.inner.for_route(&method, &route),
        }
    }

    /// The same binding as [`Fingerprinter::for_route`], as an opaque handle for
    /// [`route_fingerprint`]: a plain function call on a handle costs less per call than a
    /// method call on a class instance (no instance unwrap).
    #[napi(catch_unwind, ts_return_type = "ExternalObject<'RouteHandle'>")]
    #[must_use]
    pub fn route_handle(&self, method: String, route: String) -> External<RouteFingerprinter> {
        External::new(self.for_route(method, route))
    }
}

/// The JSON hot path shared by `fingerprintJson` and [`fingerprint_json_with`]: strings read
/// into stack buffers, the body borrowed, the result created as a JS string directly.
fn json_text<'e>(
    env: &'e Env,
    inner: &fp::Fingerprinter,
    method: &JsString<'_>,
    route: &JsString<'_>,
    body: &[u8],
) -> napi::Result<JsString<'e>> {
    let mut mbuf = [0u8; STACK_STR];
    let mut rbuf = [0u8; STACK_STR];
    let m = StrArg::read(method, &mut mbuf)?;
    let r = StrArg::read(route, &mut rbuf)?;
    match inner.fingerprint(&RequestParts::json(m.as_str(), r.as_str(), body)) {
        Ok(f) => text(env, &f),
        Err(e) => Err(fingerprint_fail(&e).throw(env)),
    }
}

/// `Fingerprinter.fingerprintJson` on the configuration in `handle` (from
/// `Fingerprinter.handle`).
#[napi(catch_unwind)]
pub fn fingerprint_json_with<'e>(
    env: &'e Env,
    #[napi(ts_arg_type = "ExternalObject<'FingerprinterHandle'>")] handle: &External<
        Arc<fp::Fingerprinter>,
    >,
    method: JsString<'_>,
    route: JsString<'_>,
    body: &[u8],
) -> napi::Result<JsString<'e>> {
    json_text(env, handle, &method, &route, body)
}

/// The fingerprint of a JSON body for the route bound in `handle` (from
/// `Fingerprinter.routeHandle`).
#[napi(catch_unwind)]
pub fn route_fingerprint<'e>(
    env: &'e Env,
    #[napi(ts_arg_type = "ExternalObject<'RouteHandle'>")] handle: &External<RouteFingerprinter>,
    body: &[u8],
) -> napi::Result<JsString<'e>> {
    handle.fingerprint(env, body)
}

/// A [`Fingerprinter`] bound to one method and route template (JSON bodies, no configured headers).
#[napi]
pub struct RouteFingerprinter {
    inner: fp::RouteFingerprinter,
}

#[napi]
impl RouteFingerprinter {
    /// The fingerprint of a JSON body sent to this route.
    #[napi(catch_unwind)]
    pub fn fingerprint<'e>(&self, env: &'e Env, body: &[u8]) -> napi::Result<JsString<'e>> {
        match self.inner.fingerprint_json(body) {
            Ok(f) => text(env, &f),
            Err(e) => Err(fingerprint_fail(&e).throw(env)),
        }
    }
}
