//! The memory store's admission gate: core's staged admission (key, body and fingerprint, scope)
//! and the flow's claim on idempo's memory store in one native call, with no JS object made per
//! request.
//!
//! One `MemoryGate` per middleware (its configuration, fingerprinter and scope rule), used only
//! for exactly idempo's `MemoryStore` with nothing listening to `store_op`. It runs the same core
//! calls as `Admission.start` / `body` / `scopeInMemory` in the same order, so it answers as they
//! do; what it saves is the `Admission` object, the argument objects and the key buffers. A
//! refusal at any stage is reported as such (nothing has touched the store then), and the host
//! asks the ordinary `Admission` for its problem. The flow of a request whose handler runs stays
//! in one of the gate's slots, addressed by its index and a tag (a slot reused for another request
//! never answers an old tag), until `finish` ends it or `take` hands it out as a `ServerFlow`.
use std::sync::Arc;

use idempo_core::fingerprint::{Fingerprinter, RequestParts};
use idempo_core::machine::admit::{
    self as core_admit, AwaitingBody, AwaitingScope, BodyRead, BodyStage, KeyStage,
    ScopeRule as CoreScopeRule, ScopeStage,
};
use idempo_core::machine::memory::Partition as MemoryPartition;
use napi::bindgen_prelude::{Buffer, BufferSlice, External};
use napi::{Either, Env, JsString};
use napi_derive::napi;

use crate::admit::{
    Admission, ScopeRule, declared, encode_answer, memory_facts, resolution, write_run,
};
use crate::error::{Fail, code};
use crate::flow::{FlowAction, FlowConfig, MemoryAdmission, ServerFlow};
use crate::jsbuf;
use crate::memstore::MemoryStoreCore;
use crate::num::to_u64;
use crate::strarg::{STACK_STR, StrArg};

/// Random bytes one flow's fencing token takes from the pool.
const ENTROPY: usize = 16;

/// Body stages `bodyStage` keeps for `admitStaged` (a ring: the oldest is dropped first, and its
/// request is admitted through `admit` from its inputs instead).
const STAGED: usize = 64;

/// The scope function's return value kinds, by the number the host passes (as `ScopeReturn`'s
/// `kind`); 5: the route has a scope function the host calls once the body stage passed.
const SCOPE_KINDS: [&str; 5] = ["not_called", "string", "nothing", "other", "raised"];
const SCOPE_PENDING: u32 = 5;

// The slots live in one `Vec` reused across requests: boxing the flow would cost an allocation
// per request for nothing.
#[allow(clippy::large_enum_variant)]
enum Slot {
    Free,
    /// A request past its body stage whose scope function is being called.
    Scope(AwaitingScope, u32),
    /// A request whose handler runs.
    Flow(ServerFlow, u32),
}

/// Core's whole admission and the memory store's claim in one call, for one middleware on
/// exactly idempo's `MemoryStore` (no object per request; see `admit`).
#[napi]
pub struct MemoryGate {
    config: FlowConfig,
    fingerprinter: Arc<Fingerprinter>,
    rule: CoreScopeRule,
    slots: Vec<Slot>,
    free: Vec<u32>,
    tag: u32,
    pool: Vec<u8>,
    pool_at: usize,
    warning: Option<String>,
    /// The body stages `bodyStage` passed, by ticket (see `admitStaged`).
    staged: Vec<Option<(u32, AwaitingScope)>>,
    staged_at: usize,
    ticket: u32,
}

/// What `admit` and `scope` write to `facts[0]`.
mod result {
    // 0: refused at some stage (nothing ran on the store): ask the ordinary admission how.
    // 1: run the handler, 2: answer now, as `Admission.scopeInMemory` writes them.
    /// Go on: the flow's first action after the claim (`start()` on the returned flow).
    pub(super) const CONTINUE: u8 = 3;
    /// The pool has too few random bytes for a flow (nothing ran): `refill`, then call again.
    pub(super) const NEED_ENTROPY: u8 = 4;
    /// The body stage passed and the route's scope function is to be called: `scope()` (or
    /// `takeAdmission()`) with the slot.
    pub(super) const SCOPE: u8 = 5;
    /// `admitStaged`: the ticket's body stage is no longer kept (nothing ran): `admit` the
    /// request from its inputs.
    pub(super) const RESTAGE: u8 = 6;
}

fn read<'b>(s: &JsString<'_>, buf: &'b mut [u8; STACK_STR]) -> napi::Result<StrArg<'b>> {
    StrArg::read(s, buf)
}

/// A request's parts as JavaScript passed them, for core's body stage.
struct Request<'a, 'j> {
    method: &'a JsString<'j>,
    target: &'a JsString<'j>,
    content_type: Option<&'a JsString<'j>>,
    /// The fingerprinted headers as a flat `[name, value, ...]` list.
    headers: Option<Vec<String>>,
    body: &'a [u8],
}

impl MemoryGate {
    /// Core's key stage on the key header's one field (if any) and the declared body length.
    fn run_key_stage(
        &self,
        key: Option<JsString<'_>>,
        declared_length: Option<f64>,
    ) -> napi::Result<KeyStage> {
        let field = key.map(JsString::into_latin1).transpose()?;
        let fields: Vec<&[u8]> = field.iter().map(|f| f.as_slice()).collect();
        Ok(core_admit::admit(
            &self.config.inner,
            &fields,
            declared(declared_length),
        ))
    }

    /// Core's body stage (the body, then its fingerprint) on `request`, the strings read on the
    /// stack where they fit; also the method as read into `method_buf`, for the claim.
    fn run_body_stage<'b>(
        &self,
        env: &Env,
        w: AwaitingBody,
        request: &Request<'_, '_>,
        method_buf: &'b mut [u8; STACK_STR],
    ) -> napi::Result<(BodyStage, StrArg<'b>)> {
        let (mut tb, mut cb) = ([0; STACK_STR], [0; STACK_STR]);
        let method = read(request.method, method_buf)?;
        let target = read(request.target, &mut tb)?;
        let content_type = request.content_type.map(|c| read(c, &mut cb)).transpose()?;
        let flat = request.headers.as_deref().unwrap_or_default();
        let pairs: Vec<(&str, &str)> = flat
            .chunks_exact(2)
            .map(|c| (c[0].as_str(), c[1].as_str()))
            .collect();
        let read_body = BodyRead::Complete(RequestParts {
            method: method.as_str(),
            route: target.as_str(),
            headers: &pairs,
            content_type: content_type.as_ref().map(StrArg::as_str),
            body: request.body,
        });
        let stage = w
            .body(read_body, &self.fingerprinter)
            .map_err(|e| Fail::new(code::FINGERPRINT, e.to_string()).throw(env))?;
        Ok((stage, method))
    }
}

#[napi]
impl MemoryGate {
    /// The gate of one middleware: its flow configuration, fingerprinter handle and scope rule.
    #[napi(constructor, catch_unwind)]
    pub fn new(
        config: &FlowConfig,
        #[napi(ts_arg_type = "ExternalObject<'FingerprinterHandle'>")] fingerprinter: &External<
            Arc<Fingerprinter>,
        >,
        rule: &ScopeRule,
    ) -> Self {
        Self {
            config: FlowConfig {
                inner: Arc::clone(&config.inner),
            },
            fingerprinter: Arc::clone(fingerprinter),
            rule: rule.core(),
            slots: Vec::new(),
            free: Vec::new(),
            tag: 0,
            pool: Vec::new(),
            pool_at: 0,
            warning: None,
            staged: Vec::new(),
            staged_at: 0,
            ticket: 0,
        }
    }

    /// Fresh random bytes for the flows' fencing tokens (a multiple of 16; each flow takes the
    /// next 16, none is used twice).
    #[napi(catch_unwind)]
    pub fn refill(&mut self, entropy: &[u8]) {
        self.pool.clear();
        self.pool.extend_from_slice(entropy);
        self.pool_at = 0;
    }

    /// Core's key stage (`Admission.start` without the object), for the `Idempotency-Key` field
    /// (one value, read as Latin-1 bytes as Node gives it; `null`: none) and the declared body
    /// length: -1 pass through, -2 refused (`Admission.start` says how), else the most body
    /// bytes to read.
    #[napi(catch_unwind)]
    pub fn key_stage(
        &self,
        key: Option<JsString<'_>>,
        declared_length: Option<f64>,
    ) -> napi::Result<f64> {
        Ok(match self.run_key_stage(key, declared_length)? {
            KeyStage::PassThrough => -1.0,
            KeyStage::Refuse(_) => -2.0,
            KeyStage::Continue(w) => {
                crate::num::from_u64(u64::try_from(w.body_limit()).unwrap_or(u64::MAX))
            }
        })
    }

    /// Core's key and body stages as `admit` runs them (the key field, the declared length, then
    /// the body and its fingerprint), with nothing claimed: 0 when one refuses the request
    /// (`Admission.start` and `body` say how), else a ticket (never 0) under which the passed
    /// body stage is kept for `admitStaged` (its `admit` on the same inputs would pass them
    /// again). For a host that must refuse a body before its framework parses it but claims the
    /// key later (Fastify: `preParsing`, then the scope stage in `preHandler`). The last
    /// `STAGED` body stages are kept; an older one is dropped (`admitStaged` then says so).
    #[napi(
        catch_unwind,
        ts_args_type = "key: string | null, declaredLength: number | null, method: string, target: string, body: Buffer, contentType: string | null, headers: string[] | null"
    )]
    #[allow(clippy::too_many_arguments)]
    pub fn body_stage(
        &mut self,
        env: Env,
        key: Option<JsString<'_>>,
        declared_length: Option<f64>,
        method: JsString<'_>,
        target: JsString<'_>,
        body: &[u8],
        content_type: Option<JsString<'_>>,
        headers: Option<Vec<String>>,
    ) -> napi::Result<u32> {
        let KeyStage::Continue(w) = self.run_key_stage(key, declared_length)? else {
            return Ok(0);
        };
        let mut mb = [0; STACK_STR];
        let request = Request {
            method: &method,
            target: &target,
            content_type: content_type.as_ref(),
            headers,
            body,
        };
        let (stage, _) = self.run_body_stage(&env, w, &request, &mut mb)?;
        Ok(match stage {
            BodyStage::Continue(s) => self.stage(s),
            BodyStage::Refuse(_) => 0,
        })
    }

    /// The whole admission of a request whose body was read (`body`, at most the key stage's
    /// limit), then the claim on `store` at `nowMs`: the key stage again (as `keyStage`), the
    /// body stage (method, request target, content type, the headers as a flat `[name, value,
    /// ...]` list when the fingerprint reads some), then the scope stage with `scope` (the
    /// scope function's return value kind: 0 `not_called`, 1 `string`, 2 `nothing`, 3 `other`,
    /// 4 `raised`, with `scopeText` as `ScopeReturn.text`; 5: the route has a scope function,
    /// call it now: result 5), the route and `authenticated`, then the flow and its claim as
    /// `Admission.scopeInMemory` runs them. `facts` (at least 128 bytes) as
    /// `Admission.scopeInMemory`'s, plus: result 0 is a refusal at any stage (the ordinary
    /// admission gives the problem), 4 asks for `refill` first (nothing ran), 5 holds the request
    /// for its scope function; for 1 and 5 the slot index (u32 LE) at 4 and its tag (u32 LE) at
    /// 28. Byte 1: `warning()` has a warning to emit.
    #[napi(
        catch_unwind,
        ts_return_type = "ServerFlow | Buffer | null",
        ts_args_type = "store: MemoryStoreCore, nowMs: number, key: string | null, declaredLength: number | null, method: string, target: string, route: string, body: Buffer, contentType: string | null, headers: string[] | null, authenticated: boolean, scope: number, scopeText: string | null, partitioned: boolean, facts: Uint8Array"
    )]
    #[allow(clippy::too_many_arguments)]
    pub fn admit(
        &mut self,
        env: Env,
        store: &mut MemoryStoreCore,
        now_ms: f64,
        key: Option<JsString<'_>>,
        declared_length: Option<f64>,
        method: JsString<'_>,
        target: JsString<'_>,
        route: JsString<'_>,
        body: &[u8],
        content_type: Option<JsString<'_>>,
        headers: Option<Vec<String>>,
        authenticated: bool,
        scope: u32,
        scope_text: Option<String>,
        partitioned: bool,
        facts: Option<&mut [u8]>,
    ) -> napi::Result<Option<Either<ServerFlow, Buffer>>> {
        let Some(facts) = self.facts_for_flow(&env, facts)? else {
            return Ok(None);
        };
        let KeyStage::Continue(w) = self.run_key_stage(key, declared_length)? else {
            return Ok(None);
        };
        let mut mb = [0; STACK_STR];
        let request = Request {
            method: &method,
            target: &target,
            content_type: content_type.as_ref(),
            headers,
            body,
        };
        let (stage, method) = self.run_body_stage(&env, w, &request, &mut mb)?;
        let s = match stage {
            BodyStage::Refuse(_) => return Ok(None),
            BodyStage::Continue(s) => s,
        };
        self.after_body(
            &env,
            s,
            store,
            now_ms,
            method.as_str(),
            &route,
            authenticated,
            scope,
            scope_text.as_deref(),
            partitioned,
            facts,
        )
    }

    /// `admit` for a request whose key and body stages `bodyStage` passed (its `ticket`): the
    /// scope stage and the claim as `admit` runs them, on the body stage kept, whose inputs are
    /// not passed again. Result 6: that body stage is no longer kept (nothing ran): `admit`
    /// the request from its inputs. A ticket is used once (4 keeps it: `refill`, then call
    /// again).
    #[napi(
        catch_unwind,
        ts_return_type = "ServerFlow | Buffer | null",
        ts_args_type = "ticket: number, store: MemoryStoreCore, nowMs: number, method: string, route: string, authenticated: boolean, scope: number, scopeText: string | null, partitioned: boolean, facts: Uint8Array"
    )]
    #[allow(clippy::too_many_arguments)]
    pub fn admit_staged(
        &mut self,
        env: Env,
        ticket: u32,
        store: &mut MemoryStoreCore,
        now_ms: f64,
        method: JsString<'_>,
        route: JsString<'_>,
        authenticated: bool,
        scope: u32,
        scope_text: Option<String>,
        partitioned: bool,
        facts: Option<&mut [u8]>,
    ) -> napi::Result<Option<Either<ServerFlow, Buffer>>> {
        let Some(facts) = self.facts_for_flow(&env, facts)? else {
            return Ok(None);
        };
        let Some(s) = self.unstage(ticket) else {
            facts[0] = result::RESTAGE;
            return Ok(None);
        };
        self.after_scope_read(
            &env,
            s,
            store,
            now_ms,
            &method,
            &route,
            authenticated,
            scope,
            scope_text.as_deref(),
            partitioned,
            facts,
        )
    }

    /// The scope stage and the claim of a request `admit` held for its scope function (result
    /// 5, `slot` and `tag` from its facts), as `admit` runs them; the slot is given up whatever
    /// the result (4 keeps it: `refill`, then call again).
    #[napi(
        catch_unwind,
        ts_return_type = "ServerFlow | Buffer | null",
        ts_args_type = "slot: number, tag: number, store: MemoryStoreCore, nowMs: number, method: string, route: string, authenticated: boolean, scope: number, scopeText: string | null, partitioned: boolean, facts: Uint8Array"
    )]
    #[allow(clippy::too_many_arguments)]
    pub fn scope(
        &mut self,
        env: Env,
        slot: u32,
        tag: u32,
        store: &mut MemoryStoreCore,
        now_ms: f64,
        method: JsString<'_>,
        route: JsString<'_>,
        authenticated: bool,
        scope: u32,
        scope_text: Option<String>,
        partitioned: bool,
        facts: Option<&mut [u8]>,
    ) -> napi::Result<Option<Either<ServerFlow, Buffer>>> {
        let Some(facts) = self.facts_for_flow(&env, facts)? else {
            return Ok(None);
        };
        let Slot::Scope(s, _) = self.release(slot, tag, true).map_err(|f| f.throw(&env))? else {
            return Err(Fail::new(code::FLOW, "the slot holds no admission").throw(&env));
        };
        if scope == SCOPE_PENDING {
            // The scope function was called: its return value's kind, never "call it".
            return Err(unknown_scope_kind().throw(&env));
        }
        self.after_scope_read(
            &env,
            s,
            store,
            now_ms,
            &method,
            &route,
            authenticated,
            scope,
            scope_text.as_deref(),
            partitioned,
            facts,
        )
    }

    /// The request `admit` held for its scope function (result 5) as an `Admission` in its
    /// scope stage (for a scope function whose answer is awaited); the slot is given up.
    #[napi(catch_unwind)]
    pub fn take_admission(&mut self, env: Env, slot: u32, tag: u32) -> napi::Result<Admission> {
        match self.release(slot, tag, true).map_err(|f| f.throw(&env))? {
            Slot::Scope(s, _) => Ok(Admission::awaiting_scope(s)),
            _ => Err(Fail::new(code::FLOW, "the slot holds no admission").throw(&env)),
        }
    }

    /// Gives up what a slot holds (a request dropped before its scope stage); nothing when the
    /// tag is stale.
    #[napi(catch_unwind)]
    pub fn drop_slot(&mut self, slot: u32, tag: u32) {
        let _ = self.release(slot, tag, false);
    }

    /// The warning of the last admission that had one (facts byte 1).
    #[napi(getter)]
    #[must_use]
    pub fn warning(&self) -> Option<String> {
        self.warning.clone()
    }

    /// `ServerFlow.handlerFinishedInMemory()` on the flow in `slot` (result 1), with the
    /// response's header fields as one string: each name and value followed by a line feed
    /// (neither can hold one: Node refuses such a header). The slot is given up once the flow
    /// has answered; otherwise `take()` hands the flow out for the steps that follow.
    #[napi(catch_unwind, ts_return_type = "string | FlowAction")]
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        &mut self,
        env: Env,
        slot: u32,
        tag: u32,
        store: &mut MemoryStoreCore,
        now_ms: f64,
        status: u32,
        headers: String,
        body: BufferSlice<'_>,
        body_to_store: Option<&[u8]>,
        framework: Option<bool>,
        body_truncated: Option<bool>,
    ) -> napi::Result<Either<String, FlowAction>> {
        let pairs = split_headers(&headers).map_err(|f| f.throw(&env))?;
        let flow = self.flow_mut(slot, tag).map_err(|f| f.throw(&env))?;
        let r = flow.finish_pairs_in_memory(
            &env,
            store,
            now_ms,
            status,
            pairs,
            body,
            body_to_store,
            framework,
            body_truncated,
        );
        if r.is_err() || flow.done() {
            let _ = self.release(slot, tag, false);
        }
        r
    }

    /// The flow in `slot` (result 1) as a `ServerFlow`, for any step other than `finish`; the
    /// slot is given up.
    #[napi(catch_unwind)]
    pub fn take(&mut self, env: Env, slot: u32, tag: u32) -> napi::Result<ServerFlow> {
        match self.release(slot, tag, true).map_err(|f| f.throw(&env))? {
            Slot::Flow(f, _) => Ok(f),
            _ => Err(Fail::new(code::FLOW, "the slot holds no flow").throw(&env)),
        }
    }

    /// Slots in use (requests held for their scope function or running their handler).
    #[napi(getter)]
    #[must_use]
    pub fn held(&self) -> u32 {
        u32::try_from(self.slots.len() - self.free.len()).unwrap_or(u32::MAX)
    }
}

impl MemoryGate {
    /// The host's facts buffer (see `admit`), or `None` once result 4 is written to it: the pool
    /// has too few random bytes for a flow (nothing ran).
    fn facts_for_flow<'f>(
        &self,
        env: &Env,
        facts: Option<&'f mut [u8]>,
    ) -> napi::Result<Option<&'f mut [u8]>> {
        let facts = memory_facts(facts).map_err(|f| f.throw(env))?;
        if self.pool.len() < self.pool_at + ENTROPY {
            facts[0] = result::NEED_ENTROPY;
            return Ok(None);
        }
        Ok(Some(facts))
    }

    /// `after_body` with the method as JavaScript passed it (`admitStaged`, `scope`).
    #[allow(clippy::too_many_arguments)]
    fn after_scope_read(
        &mut self,
        env: &Env,
        s: AwaitingScope,
        store: &mut MemoryStoreCore,
        now_ms: f64,
        method: &JsString<'_>,
        route: &JsString<'_>,
        authenticated: bool,
        scope: u32,
        scope_text: Option<&str>,
        partitioned: bool,
        facts: &mut [u8],
    ) -> napi::Result<Option<Either<ServerFlow, Buffer>>> {
        let mut mb = [0; STACK_STR];
        let method = read(method, &mut mb)?;
        self.after_body(
            env,
            s,
            store,
            now_ms,
            method.as_str(),
            route,
            authenticated,
            scope,
            scope_text,
            partitioned,
            facts,
        )
    }

    /// After the body stage (`admit`, `admitStaged`, `scope`): the request held for its scope function
    /// (`scope` 5), else the scope stage and the claim.
    #[allow(clippy::too_many_arguments)]
    fn after_body(
        &mut self,
        env: &Env,
        s: AwaitingScope,
        store: &mut MemoryStoreCore,
        now_ms: f64,
        method: &str,
        route: &JsString<'_>,
        authenticated: bool,
        scope: u32,
        scope_text: Option<&str>,
        partitioned: bool,
        facts: &mut [u8],
    ) -> napi::Result<Option<Either<ServerFlow, Buffer>>> {
        if scope == SCOPE_PENDING {
            let (index, tag) = self.hold(Slot::Scope(s, 0));
            facts[0] = result::SCOPE;
            facts[4..8].copy_from_slice(&index.to_le_bytes());
            facts[28..32].copy_from_slice(&tag.to_le_bytes());
            return Ok(None);
        }
        let mut rb = [0; STACK_STR];
        let route = read(route, &mut rb)?;
        self.claim(
            env,
            s,
            store,
            now_ms,
            method,
            route.as_str(),
            authenticated,
            scope,
            scope_text,
            partitioned,
            facts,
        )
    }

    /// Keeps a passed body stage in the ring (dropping the oldest): its ticket.
    fn stage(&mut self, s: AwaitingScope) -> u32 {
        self.ticket = self.ticket.wrapping_add(1).max(1);
        let entry = Some((self.ticket, s));
        if self.staged.len() < STAGED {
            self.staged.push(entry);
        } else {
            self.staged[self.staged_at] = entry;
        }
        self.staged_at = (self.staged_at + 1) % STAGED;
        self.ticket
    }

    /// The body stage kept under `ticket`, taken out of the ring.
    fn unstage(&mut self, ticket: u32) -> Option<AwaitingScope> {
        let place = self
            .staged
            .iter_mut()
            .find(|e| matches!(e, Some((t, _)) if *t == ticket))?;
        place.take().map(|(_, s)| s)
    }

    /// The scope stage, the flow and its claim (see `admit`).
    #[allow(clippy::too_many_arguments)]
    fn claim(
        &mut self,
        env: &Env,
        s: AwaitingScope,
        store: &mut MemoryStoreCore,
        now_ms: f64,
        method: &str,
        route: &str,
        authenticated: bool,
        scope: u32,
        scope_text: Option<&str>,
        partitioned: bool,
        facts: &mut [u8],
    ) -> napi::Result<Option<Either<ServerFlow, Buffer>>> {
        let now = to_u64(now_ms, "nowMs").map_err(|f| f.throw(env))?;
        let kind = usize::try_from(scope)
            .ok()
            .and_then(|i| SCOPE_KINDS.get(i))
            .ok_or_else(|| unknown_scope_kind().throw(env))?;
        let resolution = resolution(kind, scope_text.unwrap_or(""));
        let a = match s.scope(self.rule, resolution, authenticated, method, route) {
            ScopeStage::Refuse(_) => return Ok(None),
            ScopeStage::Admitted(a) => a,
        };
        if a.warning.is_some() {
            facts[1] = 1;
            self.warning.clone_from(&a.warning);
        }
        let mut entropy = [0u8; ENTROPY];
        entropy.copy_from_slice(&self.pool[self.pool_at..self.pool_at + ENTROPY]);
        self.pool_at += ENTROPY;
        let partition = partitioned.then_some(MemoryPartition(*a.partition.as_bytes()));
        let (flow, admitted) = ServerFlow::admit_memory(
            &self.config,
            a.scope,
            a.fingerprint,
            entropy,
            store,
            now,
            partition,
        )
        .map_err(|f| f.throw(env))?;
        Ok(match admitted {
            MemoryAdmission::Run(r) => {
                write_run(facts, &r).map_err(|f| f.throw(env))?;
                let (index, tag) = self.hold(Slot::Flow(flow, 0));
                facts[4..8].copy_from_slice(&index.to_le_bytes());
                facts[28..32].copy_from_slice(&tag.to_le_bytes());
                None
            }
            MemoryAdmission::Respond(response, outcome) => Some(Either::B(jsbuf::copy(
                env,
                &encode_answer(facts, &response, outcome),
            )?)),
            MemoryAdmission::Continue => {
                facts[0] = result::CONTINUE;
                Some(Either::A(flow))
            }
        })
    }

    /// Puts `slot` (its tag set here) into a free slot: its index and tag.
    fn hold(&mut self, slot: Slot) -> (u32, u32) {
        self.tag = self.tag.wrapping_add(1);
        let tag = self.tag;
        let slot = match slot {
            Slot::Scope(s, _) => Slot::Scope(s, tag),
            Slot::Flow(f, _) => Slot::Flow(f, tag),
            Slot::Free => Slot::Free,
        };
        if let Some(index) = self.free.pop()
            && let Some(place) = self.slots.get_mut(index as usize)
        {
            *place = slot;
            return (index, tag);
        }
        let index = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        self.slots.push(slot);
        (index, tag)
    }

    fn tag_of(&self, index: u32) -> Option<u32> {
        match self.slots.get(index as usize)? {
            Slot::Scope(_, t) | Slot::Flow(_, t) => Some(*t),
            Slot::Free => None,
        }
    }

    /// Empties `slot` when it holds `tag`: what it held.
    fn release(&mut self, index: u32, tag: u32, strict: bool) -> Result<Slot, Fail> {
        if self.tag_of(index) != Some(tag) {
            return if strict {
                Err(Fail::new(
                    code::FLOW,
                    "the gate's slot was already given up",
                ))
            } else {
                Ok(Slot::Free)
            };
        }
        let held = self
            .slots
            .get_mut(index as usize)
            .map_or(Slot::Free, |s| std::mem::replace(s, Slot::Free));
        self.free.push(index);
        Ok(held)
    }

    fn flow_mut(&mut self, index: u32, tag: u32) -> Result<&mut ServerFlow, Fail> {
        match self.slots.get_mut(index as usize) {
            Some(Slot::Flow(f, t)) if *t == tag => Ok(f),
            _ => Err(Fail::new(code::FLOW, "the gate's slot holds no such flow")),
        }
    }
}

/// A scope kind outside `SCOPE_KINDS` where a return value's kind is due.
fn unknown_scope_kind() -> Fail {
    Fail::new(code::INVALID_ARGUMENT, "unknown scope kind")
}

/// Header fields given as `name\nvalue\n...` as pairs.
fn split_headers(s: &str) -> Result<Vec<(String, String)>, Fail> {
    let mut parts = s.split_terminator('\n');
    let mut out = Vec::new();
    while let Some(name) = parts.next() {
        let value = parts
            .next()
            .ok_or_else(|| Fail::new(code::INVALID_ARGUMENT, "a header name without a value"))?;
        out.push((name.to_owned(), value.to_owned()));
    }
    Ok(out)
}
