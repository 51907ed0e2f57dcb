//! The sans-IO server flow of core, driven from JavaScript.
//!
//! The JS host loop executes the store operations and runs the handler; every decision (claim,
//! replay, 409, 422, takeover, what to store, which problem to answer) is core's.
use std::sync::Arc;

use idempo_core::fingerprint::{FingerprintConfig, FingerprintError, RequestParts};
use idempo_core::machine::problem::{self, ProblemKind};
use idempo_core::machine::{
    self, Action, CleanupStep, Event, HandlerResponse, HttpResponse, ServerFlow as CoreFlow,
    StoreOp, StoreResult,
};
use idempo_core::options::camel_case;
use idempo_core::policy::{Config, ConfigError, ConfigOptions, ResponseOrigin, TakeoverPolicy};
use idempo_core::record::FingerprintText;
use idempo_core::scope::ScopeId;
use napi::Either;
use napi::Env;
use napi::bindgen_prelude::{Buffer, BufferSlice};
use napi_derive::napi;

use crate::canonical::{limits, number_mode};
use crate::error::{Fail, code};
use crate::inline;
use crate::jsbuf;
use crate::memstore::{MemoryStoreCore, partition};
use crate::num::{from_u64, to_status, to_u64};
use crate::record::{RecordRowData, header_pairs, to_record};

/// Per-route policy: core's flat option set (`ConfigOptions`), in camelCase; every omitted field
/// takes core's `Config::default()` value.
#[napi(object)]
#[derive(Default)]
pub struct FlowConfigOptions {
    /// Lease length in ms (at least 1000).
    pub lease_ms: Option<f64>,
    /// Heartbeat interval in ms, below the lease; 0 turns heartbeats off; default a third of
    /// the lease.
    pub heartbeat_ms: Option<f64>,
    /// `"outcome_unknown"` or `"re_run"`: what an expired lease leads to.
    pub takeover: Option<String>,
    /// Retention of a record in ms.
    pub ttl_ms: Option<f64>,
    /// Whether a request without a key is refused (400); false runs it unprotected.
    pub key_required: Option<bool>,
    /// Shortest key accepted, in characters.
    pub key_min_len: Option<u32>,
    /// Longest key accepted, in characters (at most 255).
    pub key_max_len: Option<u32>,
    /// Accept only the draft sf-string key form.
    pub key_strict: Option<bool>,
    /// Statuses never stored (a retry re-runs). Default 401, 403, 407, 408, 409, 425, 429.
    pub transient_statuses: Option<Vec<u32>>,
    /// Store 5xx responses (except 503) instead of releasing the key.
    pub store_server_errors: Option<bool>,
    /// Largest response body stored for replays, bytes.
    pub max_stored_body_bytes: Option<f64>,
    /// Response headers stored and replayed.
    pub stored_headers: Option<Vec<String>>,
    /// The host's redaction hook supplies the stored body.
    pub redact: Option<bool>,
    /// `Retry-After` hint for 409 in ms.
    pub in_flight_retry_after_ms: Option<f64>,
    /// `Retry-After` for 503 in ms.
    pub unavailable_retry_after_ms: Option<f64>,
    /// Store rounds before 503 contention (1..=255).
    pub max_store_rounds: Option<u32>,
    /// How long in ms the background cleanup of a lost claim or takeover keeps retrying; the
    /// effective budget is the larger of this and the lease.
    pub cleanup_budget_ms: Option<f64>,
    /// Largest request body admitted, bytes (larger: 413).
    pub max_request_body_bytes: Option<f64>,
    /// Transactional mode: the host runs the flow's store operations and the handler's writes in
    /// one database transaction; core then asks for no heartbeat, rolls back (`release`) on a
    /// handler error, asks for `commit`, and chooses the response accordingly.
    pub transactional: Option<bool>,
}

fn config_fail(e: &impl std::fmt::Display) -> Fail {
    Fail::new(code::CONFIG, e.to_string())
}

fn build_config(o: FlowConfigOptions) -> Result<Config, Fail> {
    let ms = |v: Option<f64>, name: &str| v.map(|x| to_u64(x, name)).transpose();
    let size = |v: Option<f64>, name: &str| -> Result<Option<usize>, Fail> {
        ms(v, name)?
            .map(|x| {
                usize::try_from(x).map_err(|_| Fail::new(code::CONFIG, format!("{name} too large")))
            })
            .transpose()
    };
    let options = ConfigOptions {
        lease_ms: ms(o.lease_ms, "leaseMs")?,
        heartbeat_ms: ms(o.heartbeat_ms, "heartbeatMs")?,
        takeover: o
            .takeover
            .as_deref()
            .map(str::parse::<TakeoverPolicy>)
            .transpose()
            .map_err(|e| config_fail(&e))?,
        ttl_ms: ms(o.ttl_ms, "ttlMs")?,
        key_required: o.key_required,
        key_min_len: o.key_min_len.map(|v| v as usize),
        key_max_len: o.key_max_len.map(|v| v as usize),
        key_strict: o.key_strict,
        transient_statuses: o
            .transient_statuses
            .map(|v| v.into_iter().map(to_status).collect::<Result<_, _>>())
            .transpose()?,
        store_server_errors: o.store_server_errors,
        max_stored_body_bytes: size(o.max_stored_body_bytes, "maxStoredBodyBytes")?,
        stored_headers: o.stored_headers,
        redact: o.redact,
        in_flight_retry_after_ms: ms(o.in_flight_retry_after_ms, "inFlightRetryAfterMs")?,
        unavailable_retry_after_ms: ms(o.unavailable_retry_after_ms, "unavailableRetryAfterMs")?,
        max_store_rounds: o.max_store_rounds.map(u64::from),
        cleanup_budget_ms: ms(o.cleanup_budget_ms, "cleanupBudgetMs")?,
        max_request_body_bytes: size(o.max_request_body_bytes, "maxRequestBodyBytes")?,
        transactional: o.transactional,
    };
    options.build().map_err(|e| match e {
        // Name the option as Node spells it.
        ConfigError::NotPositive(name) => Fail::new(
            code::CONFIG,
            format!("{} must be positive", camel_case(name)),
        ),
        ConfigError::TooLarge { option, value, max } => Fail::new(
            code::CONFIG,
            format!("{} must be at most {max}, got {value}", camel_case(option)),
        ),
        other => config_fail(&other),
    })
}

/// The names of core's `Config` options in camelCase (what `FlowConfigOptions` accepts).
#[napi(catch_unwind)]
#[must_use]
pub fn config_option_names() -> Vec<String> {
    ConfigOptions::NAMES.iter().map(|n| camel_case(n)).collect()
}

/// An HTTP response to send.
#[napi(object)]
pub struct HttpResponseData {
    /// Status code.
    pub status: u32,
    /// Header fields as `[name, value]` pairs, in order.
    pub headers: Vec<Vec<String>>,
    /// Body bytes.
    pub body: Buffer,
}

pub(crate) fn http(env: &Env, r: HttpResponse) -> napi::Result<HttpResponseData> {
    Ok(HttpResponseData {
        status: u32::from(r.status),
        headers: r.headers.into_iter().map(|(n, v)| vec![n, v]).collect(),
        body: jsbuf::copy(env, &r.body)?,
    })
}

/// Core's capture plan for one response.
#[napi(object)]
pub struct CapturePlanOutput {
    /// `"pass_through"`, `"buffer"` or `"tee"`.
    pub kind: String,
    /// Largest recorded body (absent for `"pass_through"`).
    pub limit: Option<f64>,
}

fn origin(framework: Option<bool>) -> ResponseOrigin {
    if framework.unwrap_or(false) {
        ResponseOrigin::Framework
    } else {
        ResponseOrigin::Handler
    }
}

/// Counts a response body's bytes against the recording limit (core's `BodyCapture`).
#[napi]
pub struct BodyCapture {
    inner: machine::BodyCapture,
}

#[napi]
impl BodyCapture {
    /// A capture recording at most `limit` bytes.
    #[napi(constructor, catch_unwind)]
    pub fn new(env: Env, limit: f64) -> napi::Result<Self> {
        let limit = to_u64(limit, "limit").map_err(|f| f.throw(&env))?;
        Ok(Self {
            inner: machine::BodyCapture::new(usize::try_from(limit).unwrap_or(usize::MAX)),
        })
    }

    /// Counts a chunk of `length` bytes: `"record"` (append it), `"discard"` (drop what was
    /// recorded and record nothing more) or `"skip"`.
    #[napi(catch_unwind)]
    pub fn accept(&mut self, env: Env, length: f64) -> napi::Result<String> {
        let length = to_u64(length, "length").map_err(|f| f.throw(&env))?;
        Ok(match self
            .inner
            .accept(usize::try_from(length).unwrap_or(usize::MAX))
        {
            machine::CaptureStep::Record => "record",
            machine::CaptureStep::Discard => "discard",
            machine::CaptureStep::Skip => "skip",
        }
        .to_owned())
    }

    /// True once the body went past the limit.
    #[napi(getter)]
    #[must_use]
    pub fn truncated(&self) -> bool {
        self.inner.truncated()
    }
}

/// A validated per-route configuration, shared by every request of the route.
#[napi]
pub struct FlowConfig {
    pub(crate) inner: Arc<Config>,
}

#[napi]
impl FlowConfig {
    /// Validates the policy (throws `CONFIG_INVALID`).
    #[napi(constructor, catch_unwind)]
    pub fn new(env: Env, options: Option<FlowConfigOptions>) -> napi::Result<Self> {
        build_config(options.unwrap_or_default())
            .map(|c| Self { inner: Arc::new(c) })
            .map_err(|f| f.throw(&env))
    }

    /// The lease in ms.
    #[napi(getter)]
    #[must_use]
    pub fn lease_ms(&self) -> f64 {
        from_u64(self.inner.lease.lease_ms())
    }

    /// The heartbeat interval in ms, or null.
    #[napi(getter)]
    #[must_use]
    pub fn heartbeat_ms(&self) -> Option<f64> {
        self.inner.lease.heartbeat_ms().map(from_u64)
    }

    /// The record retention in ms.
    #[napi(getter)]
    #[must_use]
    pub fn ttl_ms(&self) -> f64 {
        from_u64(self.inner.ttl_ms.get())
    }

    /// The largest response body stored.
    #[napi(getter)]
    #[must_use]
    pub fn max_stored_body_bytes(&self) -> f64 {
        from_u64(u64::try_from(self.inner.response.max_body_bytes()).unwrap_or(u64::MAX))
    }

    /// Core's capture plan for a response (`spec/PROTOCOL.md` §7.5): `kind` `"pass_through"`,
    /// `"buffer"` or `"tee"`, with the recording `limit` for the last two. `streaming`: the body
    /// arrives in several parts; `framework`: the framework produced it before the handler ran.
    #[napi(catch_unwind)]
    pub fn capture_plan(
        &self,
        env: Env,
        status: u32,
        headers: Vec<Vec<String>>,
        streaming: Option<bool>,
        framework: Option<bool>,
    ) -> napi::Result<CapturePlanOutput> {
        let status = to_status(status).map_err(|f| f.throw(&env))?;
        let headers = header_pairs(headers).map_err(|f| f.throw(&env))?;
        let plan = machine::capture_plan(
            &self.inner,
            status,
            origin(framework),
            &headers,
            streaming.unwrap_or(false),
        );
        Ok(CapturePlanOutput {
            kind: plan.as_str().to_owned(),
            limit: plan
                .limit()
                .map(|l| from_u64(u64::try_from(l).unwrap_or(u64::MAX))),
        })
    }

    /// The largest request body admitted (larger: 413).
    #[napi(getter)]
    #[must_use]
    pub fn max_request_body_bytes(&self) -> f64 {
        from_u64(u64::try_from(self.inner.max_request_body_bytes.get()).unwrap_or(u64::MAX))
    }

    /// Whether a request without a key is refused.
    #[napi(getter)]
    #[must_use]
    pub fn key_required(&self) -> bool {
        self.inner.key == idempo_core::policy::KeyRequirement::Required
    }

    /// `"outcome_unknown"` or `"re_run"`.
    #[napi(getter)]
    #[must_use]
    pub fn takeover(&self) -> String {
        self.inner.takeover.as_str().to_owned()
    }

    /// Whether the host's redaction hook supplies the stored body.
    #[napi(getter)]
    #[must_use]
    pub fn redact(&self) -> bool {
        self.inner.response.redaction() == idempo_core::policy::Redaction::HostHook
    }

    /// How long (ms) the background cleanup of a lost claim or takeover keeps retrying, at
    /// least the lease.
    #[napi(getter)]
    #[must_use]
    pub fn cleanup_budget_ms(&self) -> f64 {
        from_u64(self.inner.cleanup_budget_ms.get())
    }

    /// Whether flows of this policy run in transactional mode.
    #[napi(getter)]
    #[must_use]
    pub fn transactional(&self) -> bool {
        self.inner.transactional
    }

    /// `Retry-After` (ms) core uses on a 503.
    #[napi(getter)]
    #[must_use]
    pub fn unavailable_retry_after_ms(&self) -> f64 {
        from_u64(self.inner.unavailable_retry_after_ms.get())
    }
}

/// A problem+json response of core: `kind` is one of `missing_key`, `invalid_key`,
/// `invalid_body`, `body_too_large`, `in_flight`, `mismatch`, `outcome_unknown`,
/// `store_unavailable`, `contention`.
#[napi(catch_unwind)]
pub fn problem_response(
    env: Env,
    kind: String,
    detail: Option<String>,
    reason: Option<String>,
    retry_after_ms: Option<f64>,
) -> napi::Result<HttpResponseData> {
    let k = match kind.as_str() {
        "missing_key" => ProblemKind::MissingKey,
        "invalid_key" => ProblemKind::InvalidKey,
        "invalid_body" => ProblemKind::InvalidBody,
        "body_too_large" => ProblemKind::BodyTooLarge,
        "in_flight" => ProblemKind::InFlight,
        "mismatch" => ProblemKind::Mismatch,
        "outcome_unknown" => ProblemKind::OutcomeUnknown,
        "store_unavailable" => ProblemKind::StoreUnavailable,
        "contention" => ProblemKind::Contention,
        "scope_unresolved" => ProblemKind::ScopeUnresolved,
        "body_unavailable" => ProblemKind::BodyUnavailable,
        other => {
            return Err(Fail::new(
                code::INVALID_ARGUMENT,
                format!("unknown problem kind {other:?}"),
            )
            .throw(&env));
        }
    };
    let ra = retry_after_ms
        .map(|v| to_u64(v, "retryAfterMs"))
        .transpose()
        .map_err(|f| f.throw(&env))?;
    http(
        &env,
        problem::problem_response(k, detail.as_deref(), reason.as_deref(), ra),
    )
}

/// The canonicalization settings of a route's fingerprint, for [`body_problem`].
#[napi(object)]
#[derive(Default)]
pub struct BodyCheckOptions {
    /// `"reject_precision_loss"` (the fingerprint's default) or `"rfc"`.
    pub numbers: Option<String>,
    /// RFC 6901 pointers left out of the fingerprint.
    pub exclude: Option<Vec<String>>,
    /// Maximum JSON body size in bytes (default 8 MiB).
    pub max_input_bytes: Option<u32>,
    /// Maximum JSON nesting depth (default 128).
    pub max_depth: Option<u32>,
    /// Maximum JSON members and elements (default 100000).
    pub max_members: Option<u32>,
}

/// Core's answer for a request body that cannot be fingerprinted.
#[napi(object)]
pub struct BodyProblem {
    /// `invalid_body` (400) or `body_too_large` (413), per core's `body_problem_kind`.
    pub outcome: String,
    /// Core's `invalid_body` problem response (code, byte offset and JSON Pointer in the detail).
    pub response: HttpResponseData,
}

/// Checks a JSON request body the way the route's fingerprint reads it and returns core's
/// problem response (`invalid_body`: 400, or 413 for the size limits) when it is refused, or null
/// when the body is acceptable. Hosts call it after a `CANONICALIZATION_ERROR` so every binding
/// answers a bad body with core's mapping, never its own. Throws `FINGERPRINT_ERROR` for a bad
/// exclusion pointer and `INVALID_ARGUMENT` for an unknown number mode.
#[napi(catch_unwind)]
pub fn body_problem(
    env: Env,
    body: &[u8],
    options: Option<BodyCheckOptions>,
) -> napi::Result<Option<BodyProblem>> {
    let o = options.unwrap_or_default();
    let check = || -> Result<Option<BodyProblem>, Fail> {
        let d = FingerprintConfig::default();
        let cfg = FingerprintConfig {
            exclude: o.exclude.unwrap_or_default(),
            numbers: number_mode(o.numbers.as_deref())?.unwrap_or(d.numbers),
            limits: limits(o.max_input_bytes, o.max_depth, o.max_members),
            ..d
        };
        match idempo_core::fingerprint::fingerprint(&RequestParts::json("POST", "/", body), &cfg) {
            Ok(_) => Ok(None),
            Err(FingerprintError::Body(e)) => {
                let outcome = match problem::body_problem_kind(&e) {
                    ProblemKind::BodyTooLarge => "body_too_large",
                    _ => "invalid_body",
                };
                Ok(Some(BodyProblem {
                    outcome: outcome.to_owned(),
                    response: http(&env, problem::invalid_body(&e))
                        .map_err(|e| Fail::new(code::INVALID_ARGUMENT, e.to_string()))?,
                }))
            }
            Err(other) => Err(Fail::new(code::FINGERPRINT, other.to_string()).reason(other.code())),
        }
    };
    check().map_err(|f| f.throw(&env))
}

/// One action for the host, as a flat object; `type` says which fields are set.
#[napi(object)]
pub struct FlowAction {
    /// `store`, `run_handler`, `wait`, `lease_lost`, `respond` or `propagate_error`.
    #[napi(js_name = "type")]
    pub kind: String,
    /// For `store`: `claim`, `get`, `takeover`, `mark_unknown`, `complete`, `release`, `renew`,
    /// or in transactional mode `commit` (commit the request's transaction, then `committed()`).
    pub op: Option<String>,
    /// For `store`: the record key.
    pub scope: Option<Buffer>,
    /// For `store` claim: the fingerprint to store.
    pub fingerprint: Option<String>,
    /// For `store` claim/complete/release/renew and `run_handler`: the token.
    pub token: Option<Buffer>,
    /// For `store` takeover/mark_unknown: the token the record must still hold.
    pub seen_token: Option<Buffer>,
    /// For `store` takeover: the token to write.
    pub new_token: Option<Buffer>,
    /// For `store` claim/takeover/renew: the lease length.
    pub lease_ms: Option<f64>,
    /// For `store` claim/mark_unknown/complete: the retention.
    pub ttl_ms: Option<f64>,
    /// For `store` complete: the encoded response column.
    pub response: Option<Buffer>,
    /// For `run_handler`: the generation.
    pub generation: Option<u32>,
    /// For `run_handler`: the key for downstream side effects.
    pub downstream_key: Option<String>,
    /// For `run_handler`: feed `heartbeatDue` at this interval (absent: never).
    pub heartbeat_ms: Option<f64>,
    /// For `respond`: the response.
    pub http: Option<HttpResponseData>,
    /// For `respond` and `propagate_error`: how the request ended.
    pub outcome: Option<String>,
    /// Set when a stored row was refused as corrupt (the flow treated it as a store failure).
    pub corrupt: Option<String>,
    /// The `...InMemory` methods: the primitive they ran on the memory store within the call
    /// (`claim`, `complete` or `release`); this action is what the flow asked for next.
    pub ran: Option<String>,
    /// `handlerFinishedInMemory` only, with `respond`: the response to send is exactly the
    /// handler's own (the status, header pairs and body passed in, unchanged), so `http` is
    /// left out and the host sends what it passed.
    pub live: Option<bool>,
}

fn empty(kind: &str) -> FlowAction {
    FlowAction {
        kind: kind.to_owned(),
        op: None,
        scope: None,
        fingerprint: None,
        token: None,
        seen_token: None,
        new_token: None,
        lease_ms: None,
        ttl_ms: None,
        response: None,
        generation: None,
        downstream_key: None,
        heartbeat_ms: None,
        http: None,
        outcome: None,
        corrupt: None,
        ran: None,
        live: None,
    }
}

fn store(env: &Env, op: &str, scope: &ScopeId) -> napi::Result<FlowAction> {
    let mut a = empty("store");
    a.op = Some(op.to_owned());
    a.scope = Some(jsbuf::copy(env, scope.as_bytes())?);
    Ok(a)
}

fn tok(env: &Env, t: idempo_core::record::FencingToken) -> napi::Result<Option<Buffer>> {
    jsbuf::copy(env, &t.0).map(Some)
}

fn action(env: &Env, a: Action) -> napi::Result<FlowAction> {
    Ok(match a {
        Action::Store(op) => match op {
            StoreOp::Claim {
                scope,
                fingerprint,
                token,
                lease_ms,
                ttl_ms,
            } => {
                let mut o = store(env, "claim", &scope)?;
                o.fingerprint = Some(fingerprint.as_str().to_owned());
                o.token = tok(env, token)?;
                o.lease_ms = Some(from_u64(lease_ms));
                o.ttl_ms = Some(from_u64(ttl_ms));
                o
            }
            StoreOp::Get { scope } => store(env, "get", &scope)?,
            StoreOp::TakeOver {
                scope,
                seen_token,
                new_token,
                lease_ms,
            } => {
                let mut o = store(env, "takeover", &scope)?;
                o.seen_token = tok(env, seen_token)?;
                o.new_token = tok(env, new_token)?;
                o.lease_ms = Some(from_u64(lease_ms));
                o
            }
            StoreOp::MarkUnknown {
                scope,
                seen_token,
                ttl_ms,
            } => {
                let mut o = store(env, "mark_unknown", &scope)?;
                o.seen_token = tok(env, seen_token)?;
                o.ttl_ms = Some(from_u64(ttl_ms));
                o
            }
            StoreOp::Complete {
                scope,
                token,
                response,
                ttl_ms,
            } => {
                let mut o = store(env, "complete", &scope)?;
                o.token = tok(env, token)?;
                o.response = Some(jsbuf::copy(env, &response)?);
                o.ttl_ms = Some(from_u64(ttl_ms));
                o
            }
            StoreOp::Release { scope, token } => {
                let mut o = store(env, "release", &scope)?;
                o.token = tok(env, token)?;
                o
            }
            StoreOp::Renew {
                scope,
                token,
                lease_ms,
            } => {
                let mut o = store(env, "renew", &scope)?;
                o.token = tok(env, token)?;
                o.lease_ms = Some(from_u64(lease_ms));
                o
            }
            StoreOp::Commit { scope } => store(env, "commit", &scope)?,
        },
        Action::RunHandler(r) => {
            let mut o = empty("run_handler");
            o.token = tok(env, r.token)?;
            o.generation = Some(r.generation);
            o.downstream_key = Some(r.downstream_key.as_str().to_owned());
            o.heartbeat_ms = r.heartbeat_ms.map(from_u64);
            o
        }
        Action::Wait => empty("wait"),
        Action::LeaseLost => empty("lease_lost"),
        Action::Respond { response, outcome } => {
            let mut o = empty("respond");
            o.http = Some(http(env, response)?);
            o.outcome = Some(outcome.as_str().to_owned());
            o
        }
        Action::PropagateError { outcome } => {
            let mut o = empty("propagate_error");
            o.outcome = Some(outcome.as_str().to_owned());
            o
        }
    })
}

/// The background cleanup of a claim or takeover whose answer was lost (core's `Cleanup`): run
/// `action` (a `release` or `renew` store action) after the response, never blocking the request
/// and never throwing; after each attempt ask `ServerFlow.cleanupNext` for the delay.
#[napi(object)]
pub struct FlowCleanup {
    /// The token-fenced store action to run.
    pub action: FlowAction,
    /// Retries continue while the next attempt starts within this many ms of the first (the
    /// route's `cleanupBudgetMs` or its lease, whichever is longer).
    pub budget_ms: f64,
    /// The largest delay in ms between two attempts (2000, or half the lease when shorter).
    pub max_delay_ms: f64,
}

/// The server flow of one request that carries a valid key.
#[napi]
pub struct ServerFlow {
    inner: CoreFlow,
    first: Option<Action>,
}

#[napi]
impl ServerFlow {
    /// Starts the flow for (scope id, fingerprint text) with 16 fresh random bytes (the fencing
    /// token). The first action is available from `start()`.
    #[napi(constructor, catch_unwind)]
    pub fn new(
        env: Env,
        config: &FlowConfig,
        scope: &[u8],
        fingerprint: String,
        entropy: &[u8],
    ) -> napi::Result<Self> {
        let build = || -> Result<Self, Fail> {
            let scope = ScopeId::try_from(scope)
                .map_err(|e| Fail::new(code::INVALID_ARGUMENT, e.to_string()))?;
            let fp = FingerprintText::new(fingerprint)
                .map_err(|e| Fail::new(code::INVALID_ARGUMENT, e.to_string()))?;
            let entropy: [u8; 16] = entropy.try_into().map_err(|_| {
                Fail::new(code::INVALID_ARGUMENT, "the flow needs 16 bytes of entropy")
            })?;
            let (inner, first) = CoreFlow::start(scope, fp, Arc::clone(&config.inner), entropy);
            Ok(Self {
                inner,
                first: Some(first),
            })
        };
        build().map_err(|f| f.throw(&env))
    }

    /// The first action (always a claim); callable once.
    #[napi(catch_unwind)]
    pub fn start(&mut self, env: Env) -> napi::Result<FlowAction> {
        let first = self
            .first
            .take()
            .ok_or_else(|| Fail::new(code::FLOW, "start() was already called").throw(&env))?;
        action(&env, first)
    }

    /// `start()` with its claim run on `store` (core's memory store) at `nowMs` in the same
    /// call, `partition` (8 bytes) held to its quota: the action after the claim's answer, with
    /// `ran: "claim"`. A claim the store refuses (full, over quota) is returned as the `store`
    /// action itself, untouched: run it through the `MemoryStore` as usual. Callable once.
    #[napi(catch_unwind)]
    pub fn start_in_memory(
        &mut self,
        env: Env,
        store: &mut MemoryStoreCore,
        now_ms: f64,
        partition_bytes: Option<&[u8]>,
    ) -> napi::Result<FlowAction> {
        let first = self
            .first
            .take()
            .ok_or_else(|| Fail::new(code::FLOW, "start() was already called").throw(&env))?;
        let now = to_u64(now_ms, "nowMs").map_err(|f| f.throw(&env))?;
        let p = partition(partition_bytes).map_err(|f| f.throw(&env))?;
        self.run_in_memory(&env, store, first, now, p, None)
    }

    /// Runs `next` on the memory store when it is a primitive [`inline::run`] executes, and
    /// feeds its result; else (or when the store refuses it) returns it for the host.
    fn run_in_memory(
        &mut self,
        env: &Env,
        store: &mut MemoryStoreCore,
        next: Action,
        now_ms: u64,
        partition: Option<idempo_core::machine::memory::Partition>,
        live: Option<Live<'_>>,
    ) -> napi::Result<FlowAction> {
        let Action::Store(op) = next else {
            return action(env, next);
        };
        let Some(result) = inline::run(&mut store.inner, &op, now_ms, partition) else {
            return action(env, Action::Store(op));
        };
        let after = self
            .inner
            .handle(Event::Store(result))
            .map_err(|e| flow_fail(&e).throw(env))?;
        let mut a = match after {
            // The handler's own response, unchanged: nothing crosses back (`live`).
            Action::Respond { response, outcome }
                if live.as_ref().is_some_and(|l| l.is(&response)) =>
            {
                let mut o = empty("respond");
                o.live = Some(true);
                o.outcome = Some(outcome.as_str().to_owned());
                o
            }
            // The handler's own body goes back as the very buffer the host passed (no copy).
            Action::Respond { response, outcome }
                if live.as_ref().map(|l| &l.body[..]) == Some(&response.body[..]) =>
            {
                let mut o = empty("respond");
                o.http = Some(HttpResponseData {
                    status: u32::from(response.status),
                    headers: response
                        .headers
                        .into_iter()
                        .map(|(n, v)| vec![n, v])
                        .collect(),
                    body: match live {
                        Some(l) => l.body.into_buffer(env)?,
                        None => Buffer::from(Vec::new()),
                    },
                });
                o.outcome = Some(outcome.as_str().to_owned());
                o
            }
            // The host of an `...InMemory` call has no use for the token (the store has it).
            Action::RunHandler(r) => {
                let mut o = empty("run_handler");
                o.generation = Some(r.generation);
                o.downstream_key = Some(r.downstream_key.as_str().to_owned());
                o.heartbeat_ms = r.heartbeat_ms.map(from_u64);
                o
            }
            other => action(env, other)?,
        };
        a.ran = Some(op.name().to_owned());
        Ok(a)
    }

    /// True once the flow has answered.
    #[napi(getter)]
    #[must_use]
    pub fn finished(&self) -> bool {
        self.inner.is_finished()
    }

    /// Once finished: the background cleanup to run after answering (a claim or takeover whose
    /// answer was lost may have been applied), or nothing.
    #[napi(getter)]
    pub fn cleanup(&self, env: Env) -> napi::Result<Option<FlowCleanup>> {
        self.inner
            .cleanup()
            .map(|c| {
                Ok(FlowCleanup {
                    action: action(&env, Action::Store(c.op().clone()))?,
                    budget_ms: from_u64(c.budget_ms()),
                    max_delay_ms: from_u64(c.max_delay_ms()),
                })
            })
            .transpose()
    }

    /// After cleanup attempt number `attempt` (0 first) ended `elapsedMs` after the first one
    /// started, with `applied` (the primitive's boolean result, or `null` when it failed): the
    /// delay in ms before the next attempt, or `null` to stop. Throws when there is no cleanup.
    #[napi(catch_unwind)]
    pub fn cleanup_next(
        &self,
        env: Env,
        attempt: u32,
        elapsed_ms: f64,
        applied: Option<bool>,
    ) -> napi::Result<Option<f64>> {
        let step = || -> Result<Option<f64>, Fail> {
            let cleanup = self
                .inner
                .cleanup()
                .ok_or_else(|| Fail::new(code::FLOW, "this flow has no cleanup"))?;
            let elapsed = to_u64(elapsed_ms, "elapsedMs")?;
            let event = match (applied, cleanup.op()) {
                (None, _) => Event::StoreFailed,
                (Some(ok), StoreOp::Renew { .. }) => Event::Store(StoreResult::Renewed(ok)),
                (Some(ok), _) => Event::Store(StoreResult::Released(ok)),
            };
            Ok(match cleanup.next(attempt, elapsed, &event) {
                CleanupStep::RetryAfter(ms) => Some(from_u64(ms)),
                CleanupStep::Done => None,
            })
        };
        step().map_err(|f| f.throw(&env))
    }

    fn feed(&mut self, env: &Env, event: Event) -> napi::Result<FlowAction> {
        let next = self
            .inner
            .handle(event)
            .map_err(|e| flow_fail(&e).throw(env))?;
        action(env, next)
    }

    fn feed_row(
        &mut self,
        env: &Env,
        row: Option<RecordRowData>,
        make: impl FnOnce(Option<idempo_core::record::Record>) -> Event,
    ) -> napi::Result<FlowAction> {
        match row.as_ref().map(to_record).transpose() {
            Ok(record) => self.feed(env, make(record)),
            Err(f) => {
                let mut a = self.feed(env, Event::StoreFailed)?;
                a.corrupt = Some(f.message().to_owned());
                Ok(a)
            }
        }
    }

    /// Claim inserted a new record.
    #[napi(catch_unwind)]
    pub fn claimed(&mut self, env: Env, generation: u32, now_ms: f64) -> napi::Result<FlowAction> {
        let now_ms = to_u64(now_ms, "nowMs").map_err(|f| f.throw(&env))?;
        self.feed(
            &env,
            Event::Store(StoreResult::Claimed { generation, now_ms }),
        )
    }

    /// Claim found a live record (a corrupt row counts as a store failure).
    #[napi(catch_unwind)]
    pub fn existing(
        &mut self,
        env: Env,
        row: RecordRowData,
        now_ms: f64,
    ) -> napi::Result<FlowAction> {
        let now_ms = to_u64(now_ms, "nowMs").map_err(|f| f.throw(&env))?;
        self.feed_row(&env, Some(row), |r| match r {
            Some(record) => Event::Store(StoreResult::Existing { record, now_ms }),
            None => Event::StoreFailed,
        })
    }

    /// Get's answer.
    #[napi(catch_unwind)]
    pub fn got(
        &mut self,
        env: Env,
        row: Option<RecordRowData>,
        now_ms: f64,
    ) -> napi::Result<FlowAction> {
        let now_ms = to_u64(now_ms, "nowMs").map_err(|f| f.throw(&env))?;
        self.feed_row(&env, row, |record| {
            Event::Store(StoreResult::Got { record, now_ms })
        })
    }

    /// Takeover's answer (the generation, or null when it did not apply).
    #[napi(catch_unwind)]
    pub fn took_over(&mut self, env: Env, generation: Option<u32>) -> napi::Result<FlowAction> {
        self.feed(&env, Event::Store(StoreResult::TookOver(generation)))
    }

    /// Mark-unknown's answer.
    #[napi(catch_unwind)]
    pub fn marked_unknown(&mut self, env: Env, applied: bool) -> napi::Result<FlowAction> {
        self.feed(&env, Event::Store(StoreResult::MarkedUnknown(applied)))
    }

    /// Complete's answer.
    #[napi(catch_unwind)]
    pub fn completed(&mut self, env: Env, applied: bool) -> napi::Result<FlowAction> {
        self.feed(&env, Event::Store(StoreResult::Completed(applied)))
    }

    /// Release's answer.
    #[napi(catch_unwind)]
    pub fn released(&mut self, env: Env, applied: bool) -> napi::Result<FlowAction> {
        self.feed(&env, Event::Store(StoreResult::Released(applied)))
    }

    /// Renew's answer.
    #[napi(catch_unwind)]
    pub fn renewed(&mut self, env: Env, applied: bool) -> napi::Result<FlowAction> {
        self.feed(&env, Event::Store(StoreResult::Renewed(applied)))
    }

    /// Claim's answer in transactional mode when the record's row stayed locked past the lock
    /// timeout: another request's uncommitted claim is in flight (core answers 409).
    #[napi(catch_unwind)]
    pub fn locked(&mut self, env: Env, now_ms: f64) -> napi::Result<FlowAction> {
        let now_ms = to_u64(now_ms, "nowMs").map_err(|f| f.throw(&env))?;
        self.feed(&env, Event::Store(StoreResult::Locked { now_ms }))
    }

    /// Commit's answer: the transaction committed (a failed commit is `storeFailed()`).
    #[napi(catch_unwind)]
    pub fn committed(&mut self, env: Env) -> napi::Result<FlowAction> {
        self.feed(&env, Event::Store(StoreResult::Committed))
    }

    /// The last store action failed (error, timeout).
    #[napi(catch_unwind)]
    pub fn store_failed(&mut self, env: Env) -> napi::Result<FlowAction> {
        self.feed(&env, Event::StoreFailed)
    }

    /// The heartbeat timer fired.
    #[napi(catch_unwind)]
    pub fn heartbeat_due(&mut self, env: Env) -> napi::Result<FlowAction> {
        self.feed(&env, Event::HeartbeatDue)
    }

    /// The handler returned a response (`bodyToStore`: the redaction hook's output, if any;
    /// `framework`: the framework rejected the request before the handler ran, never stored;
    /// `bodyTruncated`: the host stopped recording the body at the capture limit, so the record
    /// becomes the response-not-retained problem).
    #[napi(catch_unwind)]
    #[allow(clippy::too_many_arguments)]
    pub fn handler_finished(
        &mut self,
        env: Env,
        status: u32,
        headers: Vec<Vec<String>>,
        body: &[u8],
        body_to_store: Option<&[u8]>,
        framework: Option<bool>,
        body_truncated: Option<bool>,
    ) -> napi::Result<FlowAction> {
        let headers = header_pairs(headers).map_err(|f| f.throw(&env))?;
        let event = finished(
            status,
            headers,
            body,
            body_to_store,
            framework,
            body_truncated,
        )
        .map_err(|f| f.throw(&env))?;
        self.feed(&env, event)
    }

    /// `handlerFinished()` with the primitive it leads to (`complete` or `release`) run on
    /// `store` (core's memory store) at `nowMs` in the same call: the action after that
    /// primitive's answer, with `ran` naming it (a `respond` whose body is the handler's carries
    /// the `body` buffer passed in). Any other action, and a primitive the store refuses, is
    /// returned as it is (run it through the `MemoryStore` as usual). When the flow answers with
    /// exactly the handler's own response (a `respond` with `live`), only the outcome name is
    /// returned, as a string: no action object.
    #[napi(catch_unwind, ts_return_type = "string | FlowAction")]
    #[allow(clippy::too_many_arguments)]
    pub fn handler_finished_in_memory(
        &mut self,
        env: Env,
        store: &mut MemoryStoreCore,
        now_ms: f64,
        status: u32,
        headers: Vec<Vec<String>>,
        body: BufferSlice<'_>,
        body_to_store: Option<&[u8]>,
        framework: Option<bool>,
        body_truncated: Option<bool>,
    ) -> napi::Result<Either<String, FlowAction>> {
        let headers = header_pairs(headers).map_err(|f| f.throw(&env))?;
        self.finish_pairs_in_memory(
            &env,
            store,
            now_ms,
            status,
            headers,
            body,
            body_to_store,
            framework,
            body_truncated,
        )
    }

    /// [`ServerFlow::handler_finished_in_memory`] with the header pairs already converted.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn finish_pairs_in_memory(
        &mut self,
        env: &Env,
        store: &mut MemoryStoreCore,
        now_ms: f64,
        status: u32,
        headers: Vec<(String, String)>,
        body: BufferSlice<'_>,
        body_to_store: Option<&[u8]>,
        framework: Option<bool>,
        body_truncated: Option<bool>,
    ) -> napi::Result<Either<String, FlowAction>> {
        let now = to_u64(now_ms, "nowMs").map_err(|f| f.throw(env))?;
        let event = finished(
            status,
            headers,
            &body,
            body_to_store,
            framework,
            body_truncated,
        )
        .map_err(|f| f.throw(env))?;
        let live = match &event {
            Event::HandlerFinished(r) => Some(Live {
                status: r.status,
                headers: r.headers.clone(),
                body,
            }),
            _ => None,
        };
        let next = self
            .inner
            .handle(event)
            .map_err(|e| flow_fail(&e).throw(env))?;
        let a = self.run_in_memory(env, store, next, now, None, live)?;
        Ok(match a.outcome {
            Some(outcome) if a.live == Some(true) => Either::A(outcome),
            _ => Either::B(a),
        })
    }

    /// Whether the flow has answered and left nothing to clean up.
    pub(crate) fn done(&self) -> bool {
        self.inner.is_finished() && self.inner.cleanup().is_none()
    }

    /// The handler threw; `maybeSideEffect` false only when it certainly did nothing.
    #[napi(catch_unwind)]
    pub fn handler_failed(
        &mut self,
        env: Env,
        maybe_side_effect: bool,
    ) -> napi::Result<FlowAction> {
        self.feed(&env, Event::HandlerFailed { maybe_side_effect })
    }
}

/// What the claim run inside [`ServerFlow::admit_memory`] led to.
pub(crate) enum MemoryAdmission {
    /// Run the handler.
    Run(machine::RunHandler),
    /// Answer now (a replay, 409, 422...): the response and core's outcome name.
    Respond(HttpResponse, &'static str),
    /// Anything else (a claim the store refused, a takeover to run, ...): kept as the flow's
    /// first action, which `start()` hands to the host as usual.
    Continue,
}

impl ServerFlow {
    /// The flow of an admitted request with its claim run on `store` (core's memory store) at
    /// `now_ms` in the same call, as `new ServerFlow()` then `startInMemory()` do.
    pub(crate) fn admit_memory(
        config: &FlowConfig,
        scope: ScopeId,
        fingerprint: FingerprintText,
        entropy: [u8; 16],
        store: &mut MemoryStoreCore,
        now_ms: u64,
        partition: Option<idempo_core::machine::memory::Partition>,
    ) -> Result<(Self, MemoryAdmission), Fail> {
        let (inner, first) =
            CoreFlow::start(scope, fingerprint, Arc::clone(&config.inner), entropy);
        let mut flow = Self { inner, first: None };
        let Action::Store(op) = first else {
            flow.first = Some(first);
            return Ok((flow, MemoryAdmission::Continue));
        };
        let Some(result) = inline::run(&mut store.inner, &op, now_ms, partition) else {
            flow.first = Some(Action::Store(op));
            return Ok((flow, MemoryAdmission::Continue));
        };
        let after = flow
            .inner
            .handle(Event::Store(result))
            .map_err(|e| flow_fail(&e))?;
        let admitted = match after {
            Action::RunHandler(r) => MemoryAdmission::Run(r),
            Action::Respond { response, outcome } => {
                MemoryAdmission::Respond(response, outcome.as_str())
            }
            other => {
                flow.first = Some(other);
                MemoryAdmission::Continue
            }
        };
        Ok((flow, admitted))
    }
}

/// The response the host passed to `handlerFinishedInMemory`, to tell whether core's answer is
/// that very response (then nothing is converted back).
struct Live<'b> {
    status: u16,
    headers: Vec<(String, String)>,
    body: BufferSlice<'b>,
}

impl Live<'_> {
    fn is(&self, r: &HttpResponse) -> bool {
        r.status == self.status && r.headers == self.headers && r.body[..] == self.body[..]
    }
}

/// A flow event refused by core, as `FLOW_ERROR`.
fn flow_fail(e: &machine::FlowError) -> Fail {
    let reason = match e {
        machine::FlowError::Finished => "finished",
        _ => "unexpected_event",
    };
    Fail::new(code::FLOW, e.to_string()).reason(reason)
}

/// The handler's end as core's event.
fn finished(
    status: u32,
    headers: Vec<(String, String)>,
    body: &[u8],
    body_to_store: Option<&[u8]>,
    framework: Option<bool>,
    body_truncated: Option<bool>,
) -> Result<Event, Fail> {
    Ok(Event::HandlerFinished(HandlerResponse {
        status: to_status(status)?,
        headers,
        body: body.to_vec(),
        body_to_store: body_to_store.map(<[u8]>::to_vec),
        origin: origin(framework),
        body_truncated: body_truncated.unwrap_or(false),
    }))
}
