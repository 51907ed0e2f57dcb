//! Core's staged request admission (`idempo_core::machine::admit`, `spec/PROTOCOL.md` §7.2.1),
//! for the Node hosts.
//!
//! An [`Admission`] holds the stage core's types allow next; each method feeds one stage and
//! throws `INVALID_ARGUMENT` for a call out of order, so a host cannot skip or reorder a check.
//! The host only reads the key fields, the body and the scope function's return value.
use std::sync::Arc;

use idempo_core::fingerprint::{Fingerprinter, RequestParts};
use idempo_core::machine::admit::{
    self as core_admit, AwaitingBody, AwaitingScope, BodyRead, BodyStage, KeyStage, Refusal,
    ScopeResolution, ScopeRule as CoreScopeRule, ScopeStage,
};
use idempo_core::machine::{self, HttpResponse};
use napi::Env;
use napi::bindgen_prelude::{Buffer, BufferSlice, External};
use napi_derive::napi;

use crate::error::{Fail, code};
use crate::flow::{FlowAction, FlowConfig, HttpResponseData, MemoryAdmission, ServerFlow, http};
use crate::jsbuf;
use crate::memstore::MemoryStoreCore;
use crate::num::{from_u64, to_u64};
use idempo_core::machine::memory::Partition as MemoryPartition;
use napi::Either;

/// The size of `Admission.scopeInMemory`'s `facts`.
pub(crate) const MEMORY_FACTS: usize = 128;

/// A length as u32 (the addon's lengths are far below 4 GiB; saturates otherwise).
pub(crate) fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The declared body length (`Content-Length`) as core takes it: a length that is not a
/// non-negative integer is no usable declaration.
pub(crate) fn declared(v: Option<f64>) -> Option<u64> {
    v.filter(|v| v.is_finite() && *v >= 0.0 && v.fract() == 0.0)
        .map(|v| {
            if v >= 18_446_744_073_709_551_615.0 {
                u64::MAX
            } else {
                v as u64
            }
        })
}

/// What a scope function gave (`kind` as in [`ScopeReturn`]) as core's resolution.
pub(crate) fn resolution<'t>(kind: &str, text: &'t str) -> ScopeResolution<'t> {
    match kind {
        "not_called" => ScopeResolution::NotCalled,
        "string" => ScopeResolution::Principal(text),
        "nothing" => ScopeResolution::Nothing(if text.is_empty() { "undefined" } else { text }),
        "raised" => ScopeResolution::Raised(text),
        // Anything else is a value core cannot use as a principal: fail closed.
        _ => ScopeResolution::NotAString(text),
    }
}

/// The `facts` buffer of a memory-store call: at least `MEMORY_FACTS` bytes, zeroed over those.
pub(crate) fn memory_facts(facts: Option<&mut [u8]>) -> Result<&mut [u8], Fail> {
    let facts = facts
        .filter(|b| b.len() >= MEMORY_FACTS)
        .ok_or_else(|| Fail::new(code::INVALID_ARGUMENT, "facts must hold 128 bytes"))?;
    facts[..MEMORY_FACTS].fill(0);
    Ok(facts)
}

/// Writes a run-the-handler answer to `facts` (at least [`MEMORY_FACTS`] bytes, see
/// `Admission.scopeInMemory`): byte 0 is 1, the generation (u32 LE) at 12, `heartbeatMs` (f64
/// LE, NaN: none) at 16, the downstream key's length (u32 LE) at 24 and its ASCII bytes from 32.
pub(crate) fn write_run(facts: &mut [u8], r: &machine::RunHandler) -> Result<(), Fail> {
    let dk = r.downstream_key.as_str().as_bytes();
    if dk.len() > MEMORY_FACTS - 32 {
        return Err(Fail::new(code::FLOW, "downstream key too long"));
    }
    facts[0] = 1;
    facts[12..16].copy_from_slice(&r.generation.to_le_bytes());
    let hb = r.heartbeat_ms.map_or(f64::NAN, from_u64);
    facts[16..24].copy_from_slice(&hb.to_le_bytes());
    facts[24..28].copy_from_slice(&len32(dk.len()).to_le_bytes());
    facts[32..32 + dk.len()].copy_from_slice(dk);
    Ok(())
}

/// An answer to send now as one buffer (the outcome name, then each header name and value, every
/// string as its length (u32 LE) and UTF-8 bytes, then the body); `facts`: byte 0 is 2, the
/// status (u16 LE) at 2, the string count (u32 LE) at 4 and the body's offset (u32 LE) at 8.
pub(crate) fn encode_answer(facts: &mut [u8], response: &HttpResponse, outcome: &str) -> Vec<u8> {
    facts[0] = 2;
    facts[2..4].copy_from_slice(&response.status.to_le_bytes());
    let mut out = Vec::with_capacity(
        response.body.len()
            + outcome.len()
            + 4
            + response
                .headers
                .iter()
                .map(|(n, v)| n.len() + v.len() + 8)
                .sum::<usize>(),
    );
    let mut put = |t: &str| {
        out.extend_from_slice(&len32(t.len()).to_le_bytes());
        out.extend_from_slice(t.as_bytes());
    };
    put(outcome);
    for (n, v) in &response.headers {
        put(n);
        put(v);
    }
    let count = 1 + 2 * response.headers.len();
    facts[4..8].copy_from_slice(&len32(count).to_le_bytes());
    facts[8..12].copy_from_slice(&len32(out.len()).to_le_bytes());
    out.extend_from_slice(&response.body);
    out
}

/// What a route declares about its scope (principal), validated by core: a scope function, or
/// `public` (keys shared by every caller), or neither (shared, with a warning for authenticated
/// requests); `emptyScopeIsAnonymous` accepts an empty principal from the function.
#[napi]
pub struct ScopeRule {
    inner: CoreScopeRule,
}

#[napi]
impl ScopeRule {
    /// Validates the declaration (throws `CONFIG_INVALID` for a contradiction).
    #[napi(constructor, catch_unwind)]
    pub fn new(
        env: Env,
        has_function: bool,
        public: bool,
        empty_scope_is_anonymous: bool,
    ) -> napi::Result<Self> {
        CoreScopeRule::new(has_function, public, empty_scope_is_anonymous)
            .map(|inner| Self { inner })
            .map_err(|e| Fail::new(code::CONFIG, e.to_string()).throw(&env))
    }

    /// Core's rule.
    pub(crate) fn core(&self) -> CoreScopeRule {
        self.inner
    }

    /// Whether the route has a scope function (the host calls it).
    #[napi(getter)]
    #[must_use]
    pub fn has_function(&self) -> bool {
        matches!(self.inner, CoreScopeRule::Function { .. })
    }
}

/// What the route's scope function gave, as the host saw it.
#[napi(object)]
pub struct ScopeReturn {
    /// `not_called` (no function), `string`, `nothing` (`undefined`/`null`), `other` (not a
    /// string) or `raised`.
    pub kind: String,
    /// The string (`string`), the value's name (`nothing`: `undefined` or `null`), a description
    /// (`other`, e.g. `number 42`) or the error's message (`raised`).
    pub text: Option<String>,
}

/// An admitted request's facts, as `Admission.scope()` returns them (the record key and the
/// partition go to its `ids` argument, or come from the getters).
#[napi(object)]
pub struct AdmittedData {
    /// The parsed key.
    pub key: String,
    /// The request fingerprint.
    pub fingerprint: String,
    /// The warning to emit (no scope function, authenticated request).
    pub warning: Option<String>,
}

enum Stage {
    Body(AwaitingBody),
    Scope(AwaitingScope),
    Done,
}

/// One request's admission. `kind`: `pass_through` (run the handler unprotected), `refuse`
/// (send `problem`; log `log` when set), `read_body` (read at most `bodyLimit` bytes, then
/// `body()`), `resolve_scope` (call the scope function when the rule has one, then `scope()`)
/// or `admitted` (`key`, `scopeId`, `fingerprint`, `partition` set; emit `warning` when set).
#[napi]
pub struct Admission {
    stage: Stage,
    kind: &'static str,
    problem: Option<HttpResponse>,
    outcome: Option<&'static str>,
    log: Option<String>,
    warning: Option<String>,
    body_limit: Option<usize>,
    key: Option<String>,
    scope_id: Option<[u8; 32]>,
    fingerprint: Option<String>,
    partition: Option<[u8; 8]>,
    /// The flow `scopeInMemory` started when the handler is to run (`takeFlow()` hands it out).
    flow: Option<ServerFlow>,
}

impl Admission {
    /// An admission in its scope stage (kind `resolve_scope`), from a stage another object ran
    /// (the memory gate's).
    pub(crate) fn awaiting_scope(s: AwaitingScope) -> Self {
        Self {
            kind: "resolve_scope",
            problem: None,
            outcome: None,
            log: None,
            warning: None,
            body_limit: None,
            key: Some(s.key().as_str().to_owned()),
            scope_id: None,
            fingerprint: Some(s.fingerprint().as_str().to_owned()),
            partition: None,
            flow: None,
            stage: Stage::Scope(s),
        }
    }

    fn refused(&mut self, r: Refusal) {
        self.stage = Stage::Done;
        self.kind = "refuse";
        self.outcome = Some(r.outcome());
        self.log = r.log;
        self.problem = Some(r.response);
    }

    fn out_of_order(&self, call: &str) -> Fail {
        Fail::new(
            code::INVALID_ARGUMENT,
            format!("Admission.{call}() called in stage {:?}", self.kind),
        )
    }
}

#[napi]
impl Admission {
    /// Stage 1: the raw `Idempotency-Key` field values (in order; empty: no key) and the
    /// declared body length (`Content-Length`, null when unknown). With `facts` (at least 16
    /// bytes), the stage is also written to its first byte (0 `pass_through`, 1 `refuse`,
    /// 2 `read_body`) and `bodyLimit` as a little-endian f64 to bytes 8..16 (NaN when unset),
    /// so the host needs no getter call for them.
    #[napi(factory, catch_unwind)]
    pub fn start(
        env: Env,
        config: &FlowConfig,
        key_fields: Vec<Buffer>,
        declared_length: Option<f64>,
        facts: Option<&mut [u8]>,
    ) -> napi::Result<Self> {
        if facts.as_ref().is_some_and(|b| b.len() < 16) {
            return Err(Fail::new(code::INVALID_ARGUMENT, "facts must hold 16 bytes").throw(&env));
        }
        let fields: Vec<&[u8]> = key_fields.iter().map(|b| &b[..]).collect();
        let declared = declared(declared_length);
        let mut a = Self {
            stage: Stage::Done,
            kind: "pass_through",
            problem: None,
            outcome: None,
            log: None,
            warning: None,
            body_limit: None,
            key: None,
            scope_id: None,
            fingerprint: None,
            partition: None,
            flow: None,
        };
        match core_admit::admit(&config.inner, &fields, declared) {
            KeyStage::PassThrough => {}
            KeyStage::Refuse(r) => a.refused(r),
            KeyStage::Continue(w) => {
                a.kind = "read_body";
                a.body_limit = Some(w.body_limit());
                a.key = Some(w.key().as_str().to_owned());
                a.stage = Stage::Body(w);
            }
        }
        if let Some(out) = facts {
            out[0] = match a.kind {
                "refuse" => 1,
                "read_body" => 2,
                _ => 0,
            };
            let limit = a.body_limit.map_or(f64::NAN, |v| {
                crate::num::from_u64(u64::try_from(v).unwrap_or(u64::MAX))
            });
            out[8..16].copy_from_slice(&limit.to_le_bytes());
        }
        Ok(a)
    }

    /// Stage 2: the body as read (`overLimit`: the host stopped reading past `bodyLimit`; `body`
    /// is then ignored), with the route's fingerprinter handle, the method, the concrete request
    /// target (path and query), the `Content-Type` and the headers as a flat
    /// `[name, value, ...]` list. `unavailableFix`: the request has a body whose bytes an
    /// application parser consumed first; core refuses it with 500 `body-unavailable`, this
    /// sentence (how to keep the bytes) in the detail and the log line.
    #[napi(catch_unwind)]
    #[allow(clippy::too_many_arguments)]
    pub fn body(
        &mut self,
        env: Env,
        #[napi(ts_arg_type = "ExternalObject<'FingerprinterHandle'>")] fingerprinter: &External<
            Arc<Fingerprinter>,
        >,
        method: String,
        target: String,
        body: &[u8],
        content_type: Option<String>,
        headers: Option<Vec<String>>,
        over_limit: bool,
        unavailable_fix: Option<String>,
    ) -> napi::Result<String> {
        let Stage::Body(w) = std::mem::replace(&mut self.stage, Stage::Done) else {
            return Err(self.out_of_order("body").throw(&env));
        };
        let flat = headers.unwrap_or_default();
        let pairs: Vec<(&str, &str)> = flat
            .chunks_exact(2)
            .map(|c| (c[0].as_str(), c[1].as_str()))
            .collect();
        let read = if let Some(fix) = unavailable_fix.as_deref() {
            BodyRead::Unavailable { fix }
        } else if over_limit {
            BodyRead::OverLimit {
                read: u64::try_from(body.len()).unwrap_or(u64::MAX),
            }
        } else {
            BodyRead::Complete(RequestParts {
                method: &method,
                route: &target,
                headers: &pairs,
                content_type: content_type.as_deref(),
                body,
            })
        };
        match w
            .body(read, fingerprinter)
            .map_err(|e| Fail::new(code::FINGERPRINT, e.to_string()).throw(&env))?
        {
            BodyStage::Refuse(r) => self.refused(r),
            BodyStage::Continue(s) => {
                self.kind = "resolve_scope";
                self.fingerprint = Some(s.fingerprint().as_str().to_owned());
                self.stage = Stage::Scope(s);
            }
        }
        Ok(self.kind.to_owned())
    }

    /// Stage 3: what the route's scope function gave under `rule`, whether the request is
    /// authenticated, the method and the route template. Returns the admitted request's facts
    /// (the same as the getters, in one object), or null when it is refused (`kind` `refuse`).
    /// With `ids` (at least 40 bytes, e.g. from `Buffer.allocUnsafe`), the record key is written
    /// to its first 32 bytes and the partition to the next 8 (no buffer is made here: cheaper
    /// than the `scopeId` and `partition` getters).
    #[napi(catch_unwind)]
    #[allow(clippy::too_many_arguments)]
    pub fn scope(
        &mut self,
        env: Env,
        rule: &ScopeRule,
        method: String,
        route: String,
        authenticated: bool,
        returned: ScopeReturn,
        ids: Option<&mut [u8]>,
    ) -> napi::Result<Option<AdmittedData>> {
        if ids.as_ref().is_some_and(|b| b.len() < 40) {
            return Err(Fail::new(code::INVALID_ARGUMENT, "ids must hold 40 bytes").throw(&env));
        }
        let Stage::Scope(s) = std::mem::replace(&mut self.stage, Stage::Done) else {
            return Err(self.out_of_order("scope").throw(&env));
        };
        Ok(self
            .scoped(s, rule, &method, &route, authenticated, &returned)
            .map(|a| {
                if let Some(out) = ids {
                    out[..32].copy_from_slice(a.scope.as_bytes());
                    out[32..40].copy_from_slice(a.partition.as_bytes());
                }
                AdmittedData {
                    key: a.key.as_str().to_owned(),
                    fingerprint: a.fingerprint.as_str().to_owned(),
                    warning: a.warning,
                }
            }))
    }

    /// Stage 3 as `scope()` takes it, then the flow with its claim run on `store` (idempo's
    /// memory store) at `nowMs` in the same call, as `new ServerFlow(config, scopeId,
    /// fingerprint, entropy)` then `startInMemory(store, nowMs, partition)` would (`partition`
    /// passed when `partitioned`). The answer is written to `facts` (at least 128 bytes): byte 0
    /// the result (0 refused: the getters say how, null returned; 1 run the handler: null
    /// returned, the flow stays in the admission (`finishInMemory()`, `takeFlow()`); 2 answer now: a Buffer is returned; 3 go on: the flow is returned and its
    /// `start()` gives the next action), byte 1 set when `warning` is to be emitted. For 1: the
    /// generation (u32 LE) at 12, `heartbeatMs` (f64 LE, NaN: none) at 16, the downstream key's
    /// length (u32 LE) at 24 and its ASCII bytes from 32. For 2: the status (u16 LE) at 2, and
    /// the Buffer holds the outcome name then each header name and value, every string as its
    /// length (u32 LE) and UTF-8 bytes, then the body; the string count (u32 LE) is at 4 and the
    /// body's offset (u32 LE) at 8.
    #[napi(
        catch_unwind,
        ts_return_type = "ServerFlow | Buffer | null",
        ts_args_type = "rule: ScopeRule, method: string, route: string, authenticated: boolean, returned: ScopeReturn, config: FlowConfig, store: MemoryStoreCore, nowMs: number, entropy: Uint8Array, partitioned: boolean, facts: Uint8Array"
    )]
    #[allow(clippy::too_many_arguments)]
    pub fn scope_in_memory(
        &mut self,
        env: Env,
        rule: &ScopeRule,
        method: String,
        route: String,
        authenticated: bool,
        returned: ScopeReturn,
        config: &FlowConfig,
        store: &mut MemoryStoreCore,
        now_ms: f64,
        entropy: &[u8],
        partitioned: bool,
        facts: Option<&mut [u8]>,
    ) -> napi::Result<Option<Either<ServerFlow, Buffer>>> {
        let facts = memory_facts(facts).map_err(|f| f.throw(&env))?;
        let entropy: [u8; 16] = entropy.try_into().map_err(|_| {
            Fail::new(code::INVALID_ARGUMENT, "the flow needs 16 bytes of entropy").throw(&env)
        })?;
        let now = to_u64(now_ms, "nowMs").map_err(|f| f.throw(&env))?;
        let Stage::Scope(s) = std::mem::replace(&mut self.stage, Stage::Done) else {
            return Err(self.out_of_order("scopeInMemory").throw(&env));
        };
        let Some(a) = self.scoped(s, rule, &method, &route, authenticated, &returned) else {
            return Ok(None);
        };
        facts[1] = u8::from(a.warning.is_some());
        let partition = partitioned.then_some(MemoryPartition(*a.partition.as_bytes()));
        let (flow, admitted) = ServerFlow::admit_memory(
            config,
            a.scope,
            a.fingerprint,
            entropy,
            store,
            now,
            partition,
        )
        .map_err(|f| f.throw(&env))?;
        Ok(Some(match admitted {
            MemoryAdmission::Run(r) => {
                write_run(facts, &r).map_err(|f| f.throw(&env))?;
                // The flow stays here (no object per request): `finishInMemory()` ends it, and
                // `takeFlow()` hands it out for any other step.
                self.flow = Some(flow);
                return Ok(None);
            }
            MemoryAdmission::Respond(response, outcome) => Either::B(jsbuf::copy(
                &env,
                &encode_answer(facts, &response, outcome),
            )?),
            MemoryAdmission::Continue => {
                facts[0] = 3;
                Either::A(flow)
            }
        }))
    }

    /// The flow `scopeInMemory()` kept (result 1), as a `ServerFlow` (callable once): for any
    /// step other than `finishInMemory()`.
    #[napi(catch_unwind)]
    pub fn take_flow(&mut self, env: Env) -> napi::Result<ServerFlow> {
        self.flow
            .take()
            .ok_or_else(|| Fail::new(code::FLOW, "the admission holds no flow").throw(&env))
    }

    /// `ServerFlow.handlerFinishedInMemory()` on the flow `scopeInMemory()` kept (result 1).
    #[napi(catch_unwind, ts_return_type = "string | FlowAction")]
    #[allow(clippy::too_many_arguments)]
    pub fn finish_in_memory(
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
        let Some(flow) = self.flow.as_mut() else {
            return Err(Fail::new(code::FLOW, "the admission holds no flow").throw(&env));
        };
        flow.handler_finished_in_memory(
            env,
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

    /// Core's scope stage: the admitted request (its facts kept for the getters), or `None` when
    /// it is refused.
    fn scoped(
        &mut self,
        s: AwaitingScope,
        rule: &ScopeRule,
        method: &str,
        route: &str,
        authenticated: bool,
        returned: &ScopeReturn,
    ) -> Option<core_admit::Admitted> {
        let text = returned.text.as_deref().unwrap_or("");
        let resolution = resolution(returned.kind.as_str(), text);
        match s.scope(rule.inner, resolution, authenticated, method, route) {
            ScopeStage::Refuse(r) => {
                self.refused(r);
                None
            }
            ScopeStage::Admitted(a) => {
                self.kind = "admitted";
                self.key = Some(a.key.as_str().to_owned());
                self.scope_id = Some(*a.scope.as_bytes());
                self.partition = Some(*a.partition.as_bytes());
                self.fingerprint = Some(a.fingerprint.as_str().to_owned());
                self.warning.clone_from(&a.warning);
                Some(a)
            }
        }
    }

    /// The stage: `pass_through`, `refuse`, `read_body`, `resolve_scope` or `admitted`.
    #[napi(getter)]
    #[must_use]
    pub fn kind(&self) -> String {
        self.kind.to_owned()
    }

    /// The problem response (`refuse`).
    #[napi(getter)]
    pub fn problem(&self, env: Env) -> napi::Result<Option<HttpResponseData>> {
        self.problem.clone().map(|p| http(&env, p)).transpose()
    }

    /// The outcome name for metrics (`refuse`): `missing_key`, `invalid_key`, `body_too_large`,
    /// `invalid_body` or `scope_unresolved`.
    #[napi(getter)]
    #[must_use]
    pub fn outcome(&self) -> Option<String> {
        self.outcome.map(str::to_owned)
    }

    /// The line to log (`refuse` with `scope_unresolved`).
    #[napi(getter)]
    #[must_use]
    pub fn log(&self) -> Option<String> {
        self.log.clone()
    }

    /// The warning to emit (`admitted` without a scope function, authenticated request).
    #[napi(getter)]
    #[must_use]
    pub fn warning(&self) -> Option<String> {
        self.warning.clone()
    }

    /// How many body bytes to read at most (`read_body`).
    #[napi(getter)]
    #[must_use]
    pub fn body_limit(&self) -> Option<f64> {
        self.body_limit
            .map(|v| crate::num::from_u64(u64::try_from(v).unwrap_or(u64::MAX)))
    }

    /// The parsed key.
    #[napi(getter)]
    #[must_use]
    pub fn key(&self) -> Option<String> {
        self.key.clone()
    }

    /// The record key (`admitted`).
    #[napi(getter)]
    #[must_use]
    pub fn scope_id(&self) -> Option<Buffer> {
        self.scope_id.map(|b| Buffer::from(b.to_vec()))
    }

    /// The request fingerprint.
    #[napi(getter)]
    #[must_use]
    pub fn fingerprint(&self) -> Option<String> {
        self.fingerprint.clone()
    }

    /// The principal's quota partition (8 bytes, `admitted`), for a store with per-partition
    /// quotas (the memory store).
    #[napi(getter)]
    #[must_use]
    pub fn partition(&self) -> Option<Buffer> {
        self.partition.map(|b| Buffer::from(b.to_vec()))
    }
}
