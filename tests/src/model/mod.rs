//! A stateright model of idempo's key state machine that runs the shipped core.
//!
//! [`IdempoModel`] is a plain [`stateright::Model`]. Its transitions call `idempo_core` itself:
//! every request is a real [`ServerFlow`] (so `decide`, the flow's phases, the response policy
//! and the response encoding are the shipped code), and every store operation the flow asks for
//! is executed with the pure primitives of [`idempo_core::machine::store`] on the model's store.
//! The model owns only what the host owns: the store (one slot per scope), a logical clock, the
//! schedule (which worker or client moves next), a token counter fed to the flow as entropy, and
//! ghost variables that turn history into state for the properties (see [`props`]).
//!
//! A [`Variant`] other than [`Variant::Correct`] wraps one core call (or one host step) and
//! mutates its effect, to show that the properties catch the bug class (see `spec/MODEL.md`).
//!
//! Optional parts: store faults ([`Bounds::store_faults`]: a store operation fails, or applies
//! and its answer is lost, and the flow is fed [`Event::StoreFailed`]) and a cache in front of
//! the store ([`Bounds::cache`]: copies of completed records that serve replays, `spec/STORAGE.md`
//! §9).
use std::collections::BTreeMap;
use std::sync::Arc;

use idempo_core::fingerprint::{FingerprintConfig, RequestParts, fingerprint};
use idempo_core::machine::cache::{self, CacheAnswer};
use idempo_core::machine::problem::{ProblemKind, problem_response};
use idempo_core::machine::store::{self, ClaimOutcome};
use idempo_core::machine::{
    Action, DownstreamKey, Event, HandlerResponse, HttpResponse, Outcome, ServerFlow, StoreOp,
    StoreResult, replay_response,
};
use idempo_core::policy::{Config, LeasePolicy, TakeoverPolicy};
use idempo_core::record::{FencingToken, FingerprintText, Record, RecordState, StoredResponse};
use idempo_core::retry::{AttemptOutcome, RetryConfig, RetryDecision, RetryPolicy};
use idempo_core::scope::ScopeId;
use stateright::{Model, Property};

mod flowkey;
pub mod harness;
mod mutated;
pub mod props;
pub mod recipe_check;

pub use flowkey::FlowKey;

/// Milliseconds per model clock tick (the core's shortest accepted lease is 1 s).
pub const TICK_MS: u64 = 1_000;

/// The raw `Idempotency-Key` every client sends.
pub const RAW_KEY: &str = "order-key-0001";
/// Method and route of the modelled endpoint.
const METHOD: &str = "POST";
const ROUTE: &str = "/orders";

/// How the handler's business side effect relates to the idempotency store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EffectMode {
    /// The effect commits in the same database transaction as the claim and the completion
    /// (`BEGIN; claim; <writes>; complete; COMMIT`): other requests for the scope wait on the row
    /// lock, a crash rolls everything back. The route runs core's transactional mode
    /// (`Config::transactional`: the flow asks for the `COMMIT`). Takeover policy re-run.
    Transactional,
    /// The effect is an external call carrying the flow's [`DownstreamKey`]; the downstream
    /// service deduplicates on it (forever, in the model). Takeover policy re-run.
    DownstreamKeyed,
    /// An external effect without deduplication; an expired lease is taken over and re-run.
    UnkeyedReRun,
    /// An external effect without deduplication; an expired lease is marked outcome-unknown
    /// (core's default policy).
    UnkeyedOutcomeUnknown,
}

impl EffectMode {
    /// The takeover policy the route is configured with in this mode.
    #[must_use]
    pub fn takeover(self) -> TakeoverPolicy {
        match self {
            Self::UnkeyedOutcomeUnknown => TakeoverPolicy::OutcomeUnknown,
            _ => TakeoverPolicy::ReRun,
        }
    }
}

/// A deliberate bug wrapped around one core call (mutation testing of the properties).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The shipped core, unmodified.
    Correct,
    /// Claim as two steps: read the slot, later insert blindly if the read saw it absent
    /// (a `GET` then `SET`/`INSERT` without a unique constraint).
    CheckThenInsert,
    /// Completion without the token comparison (`UPDATE … WHERE scope_key = $1 AND state = 1`).
    CompleteWithoutToken,
    /// Release without the token comparison (`DELETE … WHERE scope_key = $1 AND state = 1`).
    ReleaseWithoutToken,
    /// The record handed to the flow carries the requester's fingerprint: the fingerprint check
    /// is skipped, so a different body under a used key is treated as a retry.
    NoFingerprintCheck,
    /// A claim whose store call failed is taken as applied (the host assumes a timed-out write
    /// went through and runs the handler): fail open.
    FaultAssumedApplied,
    /// Transactional mode with the route's `Config::transactional` left off: the host runs the
    /// handler's writes in the transaction and commits them with the completion, but core does not
    /// know, so a failed completion is answered with the handler's response (`completion_failed`).
    TransactionalFlagOff,
    /// Core's `cache::fill_budget_ms` replaced by a copy that returns the cache TTL alone, not
    /// bounded by the record's `expires_at`.
    CacheTtlUnbounded,
    /// Core's `cache::shrink_ms` replaced by a copy that keeps the budget computed at the read,
    /// without subtracting the time that passed until the `SET`: a delayed fill outlives the
    /// record.
    CacheFillDelayIgnored,
    /// Core's `cache::answer` replaced by a copy that replays any servable cached record
    /// without running `decide` on it (no fingerprint comparison).
    CacheSkipsDecide,
    /// The host ignores `ServerFlow::cleanup` (the hosts before it existed): a lost claim holds
    /// the key until its lease ends. No safety property changes; the cleanup witness is lost.
    NoCleanup,
    /// Transactional mode: a claim that waited past the lock timeout is reported to the flow as
    /// claimed (the host takes "no error" for success) instead of `StoreResult::Locked`: the
    /// duplicate runs the handler while the first request's transaction still holds the row.
    LockWaitAssumedClaimed,
}

/// One modelled client: who it is (principal: its scope) and what it sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientSpec {
    /// The authenticated principal; clients with different principals have different scopes
    /// although they send the same raw key.
    pub principal: &'static str,
    /// The JSON body.
    pub body: &'static str,
}

/// Bounds and switches of one model configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bounds {
    /// Number of workers (server processes) running flows.
    pub workers: u8,
    /// Retries per client after its first attempt.
    pub retries: u8,
    /// The clock stops at this tick.
    pub t_max: u8,
    /// Lease length in ticks.
    pub lease: u8,
    /// Record retention (TTL) in ticks.
    pub ttl: u8,
    /// Worker crashes allowed in a run.
    pub max_crashes: u8,
    /// Whether the purge (batched delete of expired records) runs.
    pub purge: bool,
    /// Whether running handlers send heartbeats (lease renewals).
    pub heartbeats: bool,
    /// Whether handlers may fail (with or without a side effect).
    pub failures: bool,
    /// Store operations that may fail in a run (each either not applied, or applied with the
    /// answer lost); 0: the store never fails.
    pub store_faults: u8,
    /// A cache in front of the store with this entry TTL in ticks (bounded by the record's
    /// `expires_at` at fill time); `None`: no cache.
    pub cache: Option<u8>,
}

impl Default for Bounds {
    /// Two workers, one retry, clock to 3, lease 1, TTL 2, one crash, purge on, no heartbeats,
    /// no handler failures, no store faults, no cache.
    fn default() -> Self {
        Self {
            workers: 2,
            retries: 1,
            t_max: 3,
            lease: 1,
            ttl: 2,
            max_crashes: 1,
            purge: true,
            heartbeats: false,
            failures: false,
            store_faults: 0,
            cache: None,
        }
    }
}

/// The model: configuration plus everything derived from it once (scopes, fingerprints, the
/// route's core [`Config`], the client retry policy).
#[derive(Clone, Debug)]
pub struct IdempoModel {
    /// Effect mode (and with it the takeover policy).
    pub mode: EffectMode,
    /// Mutation, if any.
    pub variant: Variant,
    /// Bounds.
    pub bounds: Bounds,
    /// The clients.
    pub clients: Vec<ClientSpec>,
    scopes: Vec<ScopeId>,
    client_scope: Vec<u8>,
    fingerprints: Vec<FingerprintText>,
    client_fp: Vec<u8>,
    config: Arc<Config>,
    retry: RetryPolicy,
}

/// A response body produced by a handler run: (token of the run that caused the effect, its
/// client). Handlers answer 201 with these two bytes as the body.
pub type Body = (u8, u8);

/// One business side effect that took place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Effect {
    /// Scope index.
    pub scope: u8,
    /// Ghost generation instance of the record the executing flow owned.
    pub epoch: u8,
    /// Token of the executing flow.
    pub token: u8,
    /// Client whose request ran.
    pub client: u8,
    /// Whether the executing flow's token was the record's current token at that moment.
    pub owner: bool,
}

/// The handler of a flow that was told to run it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Handler {
    /// Downstream key from core (scope, generation).
    pub downstream_key: DownstreamKey,
    /// The result of the side effect once performed.
    pub executed: Option<Body>,
    /// Whether the flow asked for heartbeats (never in transactional mode).
    pub heartbeat: bool,
}

/// A worker busy with one request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Busy {
    /// The flow's token byte (also the request id).
    pub token: u8,
    /// The client that sent the request.
    pub client: u8,
    /// The core flow.
    pub flow: FlowKey,
    /// The store operation the flow waits on; `None` while the handler runs.
    pub pending: Option<StoreOp>,
    /// Set once the flow said "run the handler".
    pub handler: Option<Handler>,
    /// Ghost: generation instance of the record this flow claimed or took over (0: none yet).
    pub epoch: u8,
    /// Whether the flow took the record over from an expired lease.
    pub took_over: bool,
    /// Transactional mode: the open transaction (what a rollback restores).
    pub tx: Option<Tx>,
    /// Check-then-insert mutation: the slot as the read step saw it.
    pub read: Option<Option<Record>>,
    /// Ghost: the store confirmed this flow's claim or takeover (its answer reached the flow).
    pub admitted: bool,
    /// Ghost: a store operation of the admission (claim, get, takeover, mark) failed.
    pub admission_fault: bool,
    /// Ghost: the flow's claim waited on another request's row lock and timed out.
    pub lock_waited: bool,
}

/// A cached copy of a completed record (`spec/STORAGE.md` §9).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cached {
    /// What the cache holds, as the record the host hands to `decide`: fingerprint, generation
    /// and response of the completed record; `expires_at` is the cache entry's own deadline
    /// (the cache knows no other), the token is zero.
    pub record: Record,
    /// Ghost: generation instance of the record the entry was filled from.
    pub epoch: u8,
}

/// A cache fill under way: the authority was read, the `SET` is not done yet.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fill {
    /// The entry to write (its deadline is set by the write).
    pub entry: Cached,
    /// The `PX` the authority computed at the read.
    pub px_ms: u64,
    /// Tick of the read.
    pub read_at: u8,
}

/// How a store step ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The operation applies and its answer reaches the flow.
    None,
    /// The operation fails without applying (connection refused, timeout before it ran).
    Failed,
    /// The operation applies but its answer is lost (timeout after commit): ambiguous.
    Lost,
}

/// An open database transaction (transactional mode): the claim is not visible to others and
/// rolls back on a crash or a release.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tx {
    /// The slot before the claim.
    pub pre: Option<Record>,
    /// The ghost generation-instance counter before the claim.
    pub pre_epoch: u8,
}

/// A server worker.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Worker {
    /// Free to take a request.
    Idle,
    /// Running a flow.
    Busy(Box<Busy>),
}

/// Where a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClientPhase {
    /// May send its next attempt.
    Ready,
    /// Waiting for the answer to the attempt with this token.
    Waiting(u8),
    /// Stopped (success, final error, or retries exhausted).
    Done,
}

/// A client's progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// Attempts sent.
    pub attempts: u8,
    /// Phase.
    pub phase: ClientPhase,
}

/// History kept as state, for the properties.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// Per scope: how many generation instances began (a record created where the slot was
    /// absent or expired). Generation numbers restart after a purge; these do not.
    pub epoch: Vec<u8>,
    /// Side effects, sorted.
    pub effects: Vec<Effect>,
    /// First completed response per (scope, epoch).
    pub completed: BTreeMap<(u8, u8), Body>,
    /// First success answered per (scope, epoch).
    pub answered: BTreeMap<(u8, u8), Body>,
    /// Downstream deduplication table (downstream-keyed mode).
    pub downstream: BTreeMap<DownstreamKey, Body>,
    /// Token of the last flow whose claim or takeover applied with its answer lost (0: none).
    pub orphan: u8,
    /// Violations seen at transitions (bits of [`props::Check`]).
    pub violated: u32,
    /// Events seen (bits of [`props::Seen`]).
    pub seen: u32,
}

/// The model state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct World {
    /// Logical clock in ticks.
    pub now: u8,
    /// The store: one slot per scope index.
    pub store: Vec<Option<Record>>,
    /// Workers, canonical order (idle first, then busy by token): workers are interchangeable.
    pub workers: Vec<Worker>,
    /// Clients.
    pub clients: Vec<Client>,
    /// Next token byte (tokens are unique across generations).
    pub next_token: u8,
    /// Crashes so far.
    pub crashes: u8,
    /// Store faults so far.
    pub faults: u8,
    /// The cache in front of the store: one entry per scope index (empty without a cache).
    pub cache: Vec<Option<Cached>>,
    /// Cache fills under way, one per scope index (empty without a cache).
    pub filling: Vec<Option<Fill>>,
    /// Background cleanups the host still has to run (core's `ServerFlow::cleanup` of a flow
    /// that answered 503 after a lost claim or takeover), by the flow's token.
    pub cleanups: Vec<PendingCleanup>,
    /// Ghost variables.
    pub ghost: Ghost,
}

/// A cleanup handed to the host by a finished flow (`spec/PROTOCOL.md` §7.4).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PendingCleanup {
    /// The finished flow's token.
    pub token: u8,
    /// Its client.
    pub client: u8,
    /// The token-fenced operation core asked for.
    pub op: StoreOp,
}

/// A step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// Client sends its next attempt; an idle worker starts a flow for it.
    Send(u8),
    /// Client gives up waiting (the server keeps working).
    Timeout(u8),
    /// The worker running the flow with this token executes its pending store operation.
    Store(u8),
    /// The handler performs its side effect.
    Execute(u8),
    /// The handler returns its response.
    Finish(u8),
    /// The handler fails.
    Fail(u8),
    /// The heartbeat timer fires.
    Heartbeat(u8),
    /// The worker crashes (its flow and request are lost).
    Crash(u8),
    /// The clock advances one tick.
    Tick,
    /// The purge deletes the expired record of this scope.
    Purge(u8),
    /// The pending store operation of this flow fails without applying.
    StoreFail(u8),
    /// The pending store operation of this flow applies, but its answer is lost.
    StoreLost(u8),
    /// The host reads the completed record of this scope to fill the cache.
    CacheRead(u8),
    /// The host writes the cache entry it read for this scope.
    CacheWrite(u8),
    /// The host runs the background cleanup of the finished flow with this token (one attempt,
    /// atomic; it may also never run: the process may die first).
    Cleanup(u8),
    /// Transactional mode: the pending claim of this flow waited on another request's row lock
    /// past the lock timeout; the host feeds `StoreResult::Locked` (`spec/PROTOCOL.md` §7.6).
    LockWait(u8),
}

fn token_bytes(token: u8) -> [u8; 16] {
    let mut e = [0u8; 16];
    e[0] = 0x7e;
    e[15] = token;
    e
}

fn body_of(bytes: &[u8]) -> Option<Body> {
    match bytes {
        [t, c] => Some((*t, *c)),
        _ => None,
    }
}

/// True for core's 503 `store-unavailable` problem with a `Retry-After` header.
fn is_store_unavailable(response: &HttpResponse) -> bool {
    let kind = ProblemKind::StoreUnavailable;
    let type_uri = kind.type_uri();
    response.status == kind.status()
        && response
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("retry-after"))
        && response
            .body
            .windows(type_uri.len())
            .any(|w| w == type_uri.as_bytes())
}

/// Who receives an answer, and what the properties need to know about the request.
#[derive(Clone, Copy, Debug)]
struct Who {
    client: u8,
    token: u8,
    epoch: u8,
    ran_handler: bool,
    took_over: bool,
    admission_fault: bool,
    lock_waited: bool,
}

impl Who {
    fn flow(b: &Busy) -> Self {
        Self {
            client: b.client,
            token: b.token,
            epoch: b.epoch,
            ran_handler: b.handler.is_some(),
            took_over: b.took_over,
            admission_fault: b.admission_fault,
            lock_waited: b.lock_waited,
        }
    }
}

fn op_scope(op: &StoreOp) -> &ScopeId {
    match op {
        StoreOp::Claim { scope, .. }
        | StoreOp::Get { scope }
        | StoreOp::TakeOver { scope, .. }
        | StoreOp::MarkUnknown { scope, .. }
        | StoreOp::Complete { scope, .. }
        | StoreOp::Release { scope, .. }
        | StoreOp::Renew { scope, .. }
        | StoreOp::Commit { scope } => scope,
    }
}

/// Runs `f` on a copy of the slot whose token is replaced by `as_token`, then puts the original
/// token back: a primitive with its token comparison removed.
fn without_token_check(
    slot: &mut Option<Record>,
    as_token: FencingToken,
    f: impl FnOnce(&mut Option<Record>) -> bool,
) -> bool {
    let original = slot.as_ref().map(|r| r.token);
    if let Some(r) = slot.as_mut() {
        r.token = as_token;
    }
    let ok = f(slot);
    if let (Some(r), Some(t)) = (slot.as_mut(), original) {
        r.token = t;
    }
    ok
}

impl IdempoModel {
    /// A model of `clients` under one raw key, in `mode`, with `bounds`, running the shipped core.
    ///
    /// # Panics
    /// When the bounds give an invalid core policy (lease shorter than 1 s, TTL 0), or more than
    /// 250 clients/attempts: a test configuration error.
    #[must_use]
    pub fn new(mode: EffectMode, clients: &[ClientSpec], bounds: Bounds) -> Self {
        let lease_ms = u64::from(bounds.lease) * TICK_MS;
        let lease = LeasePolicy::new(
            lease_ms,
            if bounds.heartbeats {
                Some(lease_ms / 2)
            } else {
                None
            },
        )
        .expect("model lease is a valid core lease");
        let config = Config {
            lease,
            takeover: mode.takeover(),
            ttl_ms: std::num::NonZeroU64::new(u64::from(bounds.ttl) * TICK_MS)
                .expect("model TTL is positive"),
            transactional: mode == EffectMode::Transactional,
            ..Config::default()
        };
        let mut scopes = Vec::new();
        let mut fingerprints: Vec<FingerprintText> = Vec::new();
        let mut client_scope = Vec::new();
        let mut client_fp = Vec::new();
        for c in clients {
            let scope = ScopeId::from_parts(c.principal, METHOD, ROUTE, RAW_KEY);
            let si = scopes.iter().position(|s| *s == scope).unwrap_or_else(|| {
                scopes.push(scope);
                scopes.len() - 1
            });
            let fp = fingerprint(
                &RequestParts::json(METHOD, ROUTE, c.body.as_bytes()),
                &FingerprintConfig::default(),
            )
            .expect("model bodies are valid JSON");
            let fp = FingerprintText::new(fp.to_string()).expect("core fingerprints are valid");
            let fi = fingerprints
                .iter()
                .position(|f| *f == fp)
                .unwrap_or_else(|| {
                    fingerprints.push(fp);
                    fingerprints.len() - 1
                });
            client_scope.push(u8::try_from(si).expect("few scopes"));
            client_fp.push(u8::try_from(fi).expect("few fingerprints"));
        }
        let retry = RetryPolicy::new(RetryConfig {
            max_attempts: 1 + u32::from(bounds.retries),
            ..RetryConfig::default()
        })
        .expect("valid retry policy");
        Self {
            mode,
            variant: Variant::Correct,
            bounds,
            clients: clients.to_vec(),
            scopes,
            client_scope,
            fingerprints,
            client_fp,
            config: Arc::new(config),
            retry,
        }
    }

    /// The same model with a mutation applied.
    #[must_use]
    pub fn with_variant(mut self, variant: Variant) -> Self {
        self.variant = variant;
        if variant == Variant::TransactionalFlagOff {
            Arc::make_mut(&mut self.config).transactional = false;
        }
        self
    }

    /// Number of distinct scopes among the clients.
    #[must_use]
    pub fn scope_count(&self) -> usize {
        self.scopes.len()
    }

    /// Scope index of client `c`.
    #[must_use]
    pub fn scope_of(&self, c: u8) -> u8 {
        self.client_scope[usize::from(c)]
    }

    /// Fingerprint index of client `c`.
    #[must_use]
    pub fn fp_of(&self, c: u8) -> u8 {
        self.client_fp[usize::from(c)]
    }

    /// The fingerprint client `c` sends.
    #[must_use]
    pub fn fingerprint_of(&self, c: u8) -> Option<&FingerprintText> {
        self.client_fp
            .get(usize::from(c))
            .and_then(|f| self.fingerprints.get(usize::from(*f)))
    }

    /// True when clients `a` and `b` send the same request in the same scope.
    #[must_use]
    pub fn same_request(&self, a: u8, b: u8) -> bool {
        self.scope_of(a) == self.scope_of(b) && self.fp_of(a) == self.fp_of(b)
    }

    fn now_ms(w: &World) -> u64 {
        u64::from(w.now) * TICK_MS
    }

    /// The store's clock (unix ms) in a state.
    #[must_use]
    pub fn clock_ms(w: &World) -> u64 {
        Self::now_ms(w)
    }

    /// The slot (index into [`World::store`]) a store operation addresses; `None` for a scope no
    /// client has.
    #[must_use]
    pub fn slot_of(&self, op: &StoreOp) -> Option<usize> {
        self.scopes.iter().position(|s| s == op_scope(op))
    }

    fn busy_index(w: &World, token: u8) -> Option<usize> {
        w.workers
            .iter()
            .position(|x| matches!(x, Worker::Busy(b) if b.token == token))
    }

    fn locked_by_other(w: &World, scope: u8, me: u8, model: &Self) -> bool {
        w.workers.iter().any(|x| match x {
            Worker::Busy(b) => b.token != me && b.tx.is_some() && model.scope_of(b.client) == scope,
            Worker::Idle => false,
        })
    }

    fn canonical(w: &mut World) {
        w.workers.sort_by_key(|x| match x {
            Worker::Idle => (0u8, 0u8),
            Worker::Busy(b) => (1, b.token),
        });
    }

    fn client_decides(&self, client: &mut Client, outcome: &AttemptOutcome, seen: &mut u32) {
        match self
            .retry
            .decide(u32::from(client.attempts), 0, outcome, 0.0)
        {
            Ok(RetryDecision::Retry { .. }) => client.phase = ClientPhase::Ready,
            Ok(RetryDecision::Stop { reason }) => {
                if reason == idempo_core::retry::StopReason::AttemptsExhausted {
                    *seen |= props::Seen::RetriesExhausted.bit();
                }
                client.phase = ClientPhase::Done;
            }
            Err(_) => client.phase = ClientPhase::Done,
        }
    }

    /// Applies the action a flow returned; `b` is put back unless the flow finished.
    fn apply(&self, w: &mut World, mut b: Box<Busy>, action: Action, read_epoch: Option<u8>) {
        match action {
            Action::Store(op) => {
                b.pending = Some(op);
                w.workers.push(Worker::Busy(b));
            }
            Action::RunHandler(run) => {
                if run.token.0 != token_bytes(b.token) {
                    w.ghost.violated |= props::Check::Flow.bit();
                }
                if !b.admitted {
                    // P9: the handler may only start once the store confirmed the claim or
                    // takeover to this flow.
                    w.ghost.violated |= props::Check::FailClosed.bit();
                }
                b.pending = None;
                b.handler = Some(Handler {
                    downstream_key: run.downstream_key,
                    executed: None,
                    heartbeat: run.heartbeat_ms.is_some(),
                });
                w.workers.push(Worker::Busy(b));
            }
            Action::Wait | Action::LeaseLost => {
                b.pending = None;
                w.workers.push(Worker::Busy(b));
            }
            Action::Respond { response, outcome } => {
                self.deliver(w, &Who::flow(&b), &response, outcome, read_epoch);
                self.close_tx(w, &b);
                if self.variant != Variant::NoCleanup
                    && let Some(c) = b.flow.0.cleanup()
                {
                    let at = w.cleanups.partition_point(|x| x.token < b.token);
                    w.cleanups.insert(
                        at,
                        PendingCleanup {
                            token: b.token,
                            client: b.client,
                            op: c.op().clone(),
                        },
                    );
                }
                w.workers.push(Worker::Idle);
            }
            Action::PropagateError { outcome } => {
                let response = HttpResponse {
                    status: 500,
                    headers: Vec::new(),
                    body: Vec::new(),
                };
                self.deliver(w, &Who::flow(&b), &response, outcome, read_epoch);
                self.close_tx(w, &b);
                w.workers.push(Worker::Idle);
            }
        }
    }

    /// A flow ended with its transaction still open: roll back.
    fn close_tx(&self, w: &mut World, b: &Busy) {
        if let Some(tx) = &b.tx {
            Self::rollback(w, usize::from(self.scope_of(b.client)), tx);
        }
    }

    fn rollback(w: &mut World, s: usize, tx: &Tx) {
        w.store[s] = tx.pre.clone();
        // A completion written in the rolled-back transaction never happened.
        let scope = u8::try_from(s).unwrap_or(u8::MAX);
        w.ghost
            .completed
            .retain(|&(cs, e), _| cs != scope || e <= tx.pre_epoch);
        w.ghost.epoch[s] = tx.pre_epoch;
    }

    /// The request answered its client: record what the properties need, then let the client
    /// react.
    fn deliver(
        &self,
        w: &mut World,
        who: &Who,
        response: &HttpResponse,
        outcome: Outcome,
        read_epoch: Option<u8>,
    ) {
        let s = self.scope_of(who.client);
        let obs = props::Answer {
            client: who.client,
            token: who.token,
            scope: s,
            status: response.status,
            outcome,
            body: body_of(&response.body),
            replay_header: response
                .headers
                .iter()
                .any(|(n, v)| n == idempo_core::machine::REPLAYED_HEADER && v == "true"),
            store_unavailable: is_store_unavailable(response),
            epoch: if outcome == Outcome::Replayed {
                read_epoch.unwrap_or(0)
            } else {
                who.epoch
            },
            ran_handler: who.ran_handler,
            took_over: who.took_over,
            admission_fault: who.admission_fault,
            lock_waited: who.lock_waited,
            record: w.store[usize::from(s)].clone(),
            now_ms: Self::now_ms(w),
        };
        props::check_answer(self, w, &obs);
        let client = &mut w.clients[usize::from(who.client)];
        if client.phase == ClientPhase::Waiting(who.token) {
            // The client classifies the answer with core, as every binding's client does: an
            // outcome-unknown problem stops it at once.
            let content_type = response
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
                .map(|(_, v)| v.as_str());
            let attempt =
                AttemptOutcome::from_response(response.status, None, content_type, &response.body);
            let mut seen = w.ghost.seen;
            self.client_decides(client, &attempt, &mut seen);
            w.ghost.seen = seen;
        }
    }

    fn feed(&self, w: &mut World, mut b: Box<Busy>, event: Event, read_epoch: Option<u8>) {
        match b.flow.0.handle(event) {
            Ok(action) => self.apply(w, b, action, read_epoch),
            Err(_) => {
                // The host fed an event the flow refused: a flow (or model) bug. Drop the request.
                w.ghost.violated |= props::Check::Flow.bit();
                b.pending = None;
                self.close_tx(w, &b);
                w.workers.push(Worker::Idle);
            }
        }
    }

    fn with_requester_fp(&self, record: Record, client: u8) -> Record {
        if self.variant == Variant::NoFingerprintCheck {
            Record {
                fingerprint: self.fingerprints[usize::from(self.fp_of(client))].clone(),
                ..record
            }
        } else {
            record
        }
    }

    /// The host looks the request up in the cache before starting a flow (`spec/STORAGE.md` §9):
    /// core's [`cache::answer`] (`decide` on the cached copy; a replay or a mismatch is answered
    /// from the cache, anything else falls through), or its mutated copy under
    /// [`Variant::CacheSkipsDecide`]. Returns true when the cache answered.
    fn cache_answers(&self, w: &mut World, c: u8, token: u8) -> bool {
        let s = usize::from(self.scope_of(c));
        let Some(Some(entry)) = w.cache.get(s).cloned() else {
            return false;
        };
        let now_ms = Self::now_ms(w);
        let fp = &self.fingerprints[usize::from(self.fp_of(c))];
        let answer = if self.variant == Variant::CacheSkipsDecide {
            mutated::answer_skipping_decide(&entry.record, now_ms)
        } else {
            cache::answer(&entry.record, fp, now_ms, &self.config)
        };
        let (response, outcome) = match answer {
            CacheAnswer::Replay(stored) => (replay_response(stored), Outcome::Replayed),
            CacheAnswer::Mismatch => (
                problem_response(ProblemKind::Mismatch, None, None, None),
                Outcome::Mismatch,
            ),
            CacheAnswer::FallThrough => return false,
        };
        let seen = if outcome == Outcome::Replayed {
            props::check_cache_replay(w, s, &entry, body_of(&response.body), now_ms);
            props::Seen::CacheHit
        } else {
            props::Seen::CacheMismatch
        };
        w.ghost.seen |= seen.bit();
        let who = Who {
            client: c,
            token,
            epoch: 0,
            ran_handler: false,
            took_over: false,
            admission_fault: false,
            lock_waited: false,
        };
        self.deliver(w, &who, &response, outcome, Some(entry.epoch));
        true
    }

    /// Fill, step one: the host reads the completed record of scope `s` from the authority and
    /// computes the fill's budget with core's [`cache::fill_budget_ms`], `min(cache TTL,
    /// expires_at − now)` on the authority's clock (its mutated copy under
    /// [`Variant::CacheTtlUnbounded`]).
    fn cache_read(&self, w: &mut World, s: usize) {
        let now_ms = Self::now_ms(w);
        let Some(ttl) = self.bounds.cache else { return };
        let Some(record) = w.store.get(s).cloned().flatten() else {
            return;
        };
        let cache_ms = u64::from(ttl) * TICK_MS;
        let (state, expires_at) = (record.state.code(), record.expires_at_ms);
        let budget = if self.variant == Variant::CacheTtlUnbounded {
            mutated::fill_budget_unbounded(state, expires_at, cache_ms, now_ms)
        } else {
            cache::fill_budget_ms(state, expires_at, cache_ms, now_ms)
        };
        // No budget: the write sends no `SET` (a zero budget is never written).
        let px_ms = budget.unwrap_or(0);
        let entry = Cached {
            record: Record {
                token: FencingToken([0; 16]),
                expires_at_ms: 0,
                ..record
            },
            epoch: w.ghost.epoch[s],
        };
        if let Some(slot) = w.filling.get_mut(s) {
            *slot = Some(Fill {
                entry,
                px_ms,
                read_at: w.now,
            });
        }
    }

    /// Fill, step two, any time later: `SET … PX`, with core's [`cache::shrink_ms`]: the time
    /// that passed since the read (the host's monotonic clock) is subtracted from the budget, so
    /// the entry dies no later than the record (its mutated copy under
    /// [`Variant::CacheFillDelayIgnored`]); an entry with no time left is not written.
    fn cache_write(&self, w: &mut World, s: usize) {
        let now_ms = Self::now_ms(w);
        let Some(fill) = w.filling.get_mut(s).and_then(Option::take) else {
            return;
        };
        let elapsed_ms = u64::from(w.now.saturating_sub(fill.read_at)) * TICK_MS;
        let px = if self.variant == Variant::CacheFillDelayIgnored {
            mutated::shrink_ignoring_delay(fill.px_ms, elapsed_ms)
        } else {
            cache::shrink_ms(fill.px_ms, elapsed_ms)
        };
        let Some(px_ms) = px else { return };
        let mut entry = fill.entry;
        entry.record.expires_at_ms = now_ms.saturating_add(px_ms);
        if let Some(slot) = w.cache.get_mut(s) {
            *slot = Some(entry);
        }
    }

    /// Whether the host may start filling the cache for scope `s`: the authority holds a live,
    /// completed record that is not in the cache yet, and no fill is under way. A record written
    /// in an open transaction is not visible to the filler (it would read the version before the
    /// transaction, absent or expired since a claim opened it, so nothing to fill).
    fn cache_fillable(&self, w: &World, s: usize) -> bool {
        let in_tx = w.workers.iter().any(|x| {
            matches!(x, Worker::Busy(b) if b.tx.is_some() && usize::from(self.scope_of(b.client)) == s)
        });
        if in_tx {
            return false;
        }
        let now_ms = Self::now_ms(w);
        let completed = w.store[s].as_ref().is_some_and(|r| {
            matches!(r.state, RecordState::Completed { .. }) && !r.is_expired(now_ms)
        });
        completed
            && w.filling[s].is_none()
            && !matches!(&w.cache[s], Some(e) if e.epoch == w.ghost.epoch[s]
                && w.store[s].as_ref().is_some_and(|r| r.generation == e.record.generation))
    }

    /// Whether a lost answer differs from a plain failure for this pending operation: a read
    /// changes nothing, and inside an open transaction (or for the claim that opens one) the
    /// broken connection rolls everything back, except for the `COMMIT` itself (the completion,
    /// when the host commits with it).
    fn lost_differs(&self, b: &Busy, op: &StoreOp) -> bool {
        match op {
            StoreOp::Get { .. } => false,
            StoreOp::Commit { .. } => true,
            StoreOp::Complete { .. } => b.tx.is_none() || !self.config.transactional,
            StoreOp::Claim { .. } => self.mode != EffectMode::Transactional,
            _ => b.tx.is_none(),
        }
    }

    /// Executes the pending store operation of busy worker `b` atomically, or fails it.
    fn store_step(&self, w: &mut World, mut b: Box<Busy>, fault: Fault) {
        let Some(op) = b.pending.take() else {
            w.workers.push(Worker::Busy(b));
            return;
        };
        let Some(si) = self.scopes.iter().position(|s| s == op_scope(&op)) else {
            // The flow addressed a scope no client has: isolation is broken.
            w.ghost.violated |= props::Check::Scopes.bit();
            w.workers.push(Worker::Idle);
            return;
        };
        let s = u8::try_from(si).unwrap_or(u8::MAX);
        if s != self.scope_of(b.client) {
            w.ghost.violated |= props::Check::Scopes.bit();
        }
        let now_ms = Self::now_ms(w);
        let admission = matches!(
            op,
            StoreOp::Claim { .. }
                | StoreOp::Get { .. }
                | StoreOp::TakeOver { .. }
                | StoreOp::MarkUnknown { .. }
        );
        if fault != Fault::None {
            w.faults += 1;
            b.admission_fault |= admission;
        }
        if fault == Fault::Failed {
            // Nothing applied; an open transaction is aborted by the error.
            if let Some(tx) = b.tx.take() {
                Self::rollback(w, si, &tx);
            }
            let event = match op {
                StoreOp::Claim { .. } if self.variant == Variant::FaultAssumedApplied => {
                    Event::Store(StoreResult::Claimed {
                        generation: 1,
                        now_ms,
                    })
                }
                _ => Event::StoreFailed,
            };
            self.feed(w, b, event, None);
            return;
        }
        let pre = w.store[si].clone();
        let orphan = pre
            .as_ref()
            .is_some_and(|r| w.ghost.orphan != 0 && r.token.0 == token_bytes(w.ghost.orphan));
        let mut read_epoch = None;
        let result = match op {
            StoreOp::Claim {
                fingerprint,
                token,
                lease_ms,
                ttl_ms,
                ..
            } => {
                let outcome = if self.variant == Variant::CheckThenInsert {
                    match b.read.take() {
                        None => {
                            // Step one: read only; the insert comes later.
                            b.read = Some(pre);
                            b.pending = Some(StoreOp::Claim {
                                scope: self.scopes[si],
                                fingerprint,
                                token,
                                lease_ms,
                                ttl_ms,
                            });
                            w.workers.push(Worker::Busy(b));
                            return;
                        }
                        Some(mut seen) => {
                            // Step two: decide on the stale read, write blindly.
                            let out = store::claim(
                                &mut seen,
                                &fingerprint,
                                token,
                                lease_ms,
                                ttl_ms,
                                now_ms,
                            );
                            if matches!(out, ClaimOutcome::Claimed { .. }) {
                                w.store[si] = seen;
                            }
                            out
                        }
                    }
                } else {
                    store::claim(
                        &mut w.store[si],
                        &fingerprint,
                        token,
                        lease_ms,
                        ttl_ms,
                        now_ms,
                    )
                };
                match outcome {
                    ClaimOutcome::Claimed { generation } => {
                        let fresh = pre.as_ref().is_none_or(|r| r.is_expired(now_ms));
                        if orphan {
                            w.ghost.seen |= props::Seen::OrphanResolved.bit();
                        }
                        if self.mode == EffectMode::Transactional {
                            b.tx = Some(Tx {
                                pre: pre.clone(),
                                pre_epoch: w.ghost.epoch[si],
                            });
                        }
                        if fresh {
                            w.ghost.epoch[si] = w.ghost.epoch[si].saturating_add(1);
                        }
                        b.epoch = w.ghost.epoch[si];
                        StoreResult::Claimed { generation, now_ms }
                    }
                    ClaimOutcome::Existing(record) => {
                        read_epoch = Some(w.ghost.epoch[si]);
                        StoreResult::Existing {
                            record: self.with_requester_fp(record, b.client),
                            now_ms,
                        }
                    }
                }
            }
            StoreOp::Get { .. } => {
                read_epoch = Some(w.ghost.epoch[si]);
                StoreResult::Got {
                    record: pre.map(|r| self.with_requester_fp(r, b.client)),
                    now_ms,
                }
            }
            StoreOp::TakeOver {
                seen_token,
                new_token,
                lease_ms,
                ..
            } => {
                let got =
                    store::takeover(&mut w.store[si], seen_token, new_token, lease_ms, now_ms);
                if got.is_some() {
                    b.epoch = w.ghost.epoch[si];
                    b.took_over = true;
                    if orphan {
                        w.ghost.seen |= props::Seen::OrphanResolved.bit();
                    }
                }
                StoreResult::TookOver(got)
            }
            StoreOp::MarkUnknown {
                seen_token, ttl_ms, ..
            } => {
                let ok = store::mark_unknown(&mut w.store[si], seen_token, ttl_ms, now_ms);
                if ok && orphan {
                    w.ghost.seen |= props::Seen::OrphanResolved.bit();
                }
                StoreResult::MarkedUnknown(ok)
            }
            StoreOp::Complete {
                token,
                response,
                ttl_ms,
                ..
            } => {
                let Ok(stored) = StoredResponse::decode(&response) else {
                    // The flow's own encoding did not decode: a core bug.
                    w.ghost.violated |= props::Check::Flow.bit();
                    self.feed(w, b, Event::StoreFailed, None);
                    return;
                };
                let body = body_of(&stored.body);
                let ok = if self.variant == Variant::CompleteWithoutToken {
                    without_token_check(&mut w.store[si], token, |slot| {
                        store::complete(slot, token, stored, ttl_ms, now_ms)
                    })
                } else {
                    store::complete(&mut w.store[si], token, stored, ttl_ms, now_ms)
                };
                if ok {
                    props::check_owner_write(w, &pre, token);
                    if let Some(body) = body {
                        let e = w.ghost.epoch[si];
                        w.ghost.completed.entry((s, e)).or_insert(body);
                    }
                    if !self.config.transactional && b.tx.take().is_some() {
                        // A host that commits with the completion (core not told: the
                        // flag-off mutation): the business writes take effect now.
                        self.record_effect(w, &b, true);
                    }
                } else {
                    w.ghost.seen |= props::Seen::StaleCompletionRejected.bit();
                }
                StoreResult::Completed(ok)
            }
            StoreOp::Release { token, .. } => {
                let ok = if self.variant == Variant::ReleaseWithoutToken {
                    without_token_check(&mut w.store[si], token, |slot| store::release(slot, token))
                } else {
                    store::release(&mut w.store[si], token)
                };
                if ok {
                    props::check_owner_write(w, &pre, token);
                    if let Some(tx) = b.tx.take() {
                        // Transactional release is the rollback.
                        Self::rollback(w, si, &tx);
                    }
                }
                StoreResult::Released(ok)
            }
            StoreOp::Renew {
                token, lease_ms, ..
            } => {
                let ok = store::renew(&mut w.store[si], token, lease_ms, now_ms);
                if ok {
                    props::check_owner_write(w, &pre, token);
                }
                StoreResult::Renewed(ok)
            }
            StoreOp::Commit { .. } => {
                // `COMMIT`: the record as written in the transaction and the business writes
                // take effect together.
                if b.tx.take().is_some() {
                    self.record_effect(w, &b, true);
                }
                StoreResult::Committed
            }
        };
        if fault == Fault::Lost {
            // Applied, answer lost. The host cannot tell this from a failure: a `COMMIT` that
            // went through stays committed (the host does not know it), any other open
            // transaction is aborted by the broken connection.
            if let Some(tx) = b.tx.take() {
                Self::rollback(w, si, &tx);
            }
            if matches!(
                result,
                StoreResult::Claimed { .. } | StoreResult::TookOver(Some(_))
            ) && self.mode != EffectMode::Transactional
            {
                w.ghost.orphan = b.token;
            }
            self.feed(w, b, Event::StoreFailed, None);
            return;
        }
        if matches!(
            result,
            StoreResult::Claimed { .. } | StoreResult::TookOver(Some(_))
        ) {
            b.admitted = true;
        }
        self.feed(w, b, Event::Store(result), read_epoch);
    }
    /// Runs the host's background cleanup `c` once, atomically: a token-fenced release (after a
    /// lost claim) or renew with 0 ms (after a lost takeover).
    fn cleanup_step(&self, w: &mut World, c: &PendingCleanup) {
        let Some(si) = self.scopes.iter().position(|s| s == op_scope(&c.op)) else {
            w.ghost.violated |= props::Check::Scopes.bit();
            return;
        };
        if u8::try_from(si).ok() != Some(self.scope_of(c.client)) {
            w.ghost.violated |= props::Check::Scopes.bit();
        }
        let now_ms = Self::now_ms(w);
        let pre = w.store[si].clone();
        let orphan = pre
            .as_ref()
            .is_some_and(|r| w.ghost.orphan != 0 && r.token.0 == token_bytes(w.ghost.orphan));
        let (token, ok) = match &c.op {
            StoreOp::Release { token, .. } => (*token, store::release(&mut w.store[si], *token)),
            StoreOp::Renew {
                token, lease_ms, ..
            } => (
                *token,
                store::renew(&mut w.store[si], *token, *lease_ms, now_ms),
            ),
            _ => {
                // Core only hands out a release or a renew.
                w.ghost.violated |= props::Check::Flow.bit();
                return;
            }
        };
        if ok {
            props::check_owner_write(w, &pre, token);
            if orphan {
                w.ghost.seen |=
                    props::Seen::OrphanResolved.bit() | props::Seen::OrphanCleaned.bit();
            }
        }
    }

    fn record_effect(&self, w: &mut World, b: &Busy, owner: bool) {
        let e = Effect {
            scope: self.scope_of(b.client),
            epoch: b.epoch,
            token: b.token,
            client: b.client,
            owner,
        };
        if b.epoch >= 2 {
            w.ghost.seen |= props::Seen::RerunAfterTtl.bit();
        }
        let at = w.ghost.effects.partition_point(|x| *x < e);
        w.ghost.effects.insert(at, e);
    }

    fn is_owner(&self, w: &World, b: &Busy) -> bool {
        let mine = FencingToken(token_bytes(b.token));
        matches!(
            &w.store[usize::from(self.scope_of(b.client))],
            Some(r) if r.token == mine && matches!(r.state, RecordState::InProgress { .. })
        )
    }

    fn execute(&self, w: &mut World, mut b: Box<Busy>) {
        let owner = self.is_owner(w, &b);
        let Some(handler) = b.handler.as_mut() else {
            w.workers.push(Worker::Busy(b));
            return;
        };
        let own: Body = (b.token, b.client);
        let result = match self.mode {
            EffectMode::DownstreamKeyed => match w.ghost.downstream.get(&handler.downstream_key) {
                Some(earlier) => Some(*earlier),
                None => {
                    w.ghost
                        .downstream
                        .insert(handler.downstream_key.clone(), own);
                    None
                }
            },
            _ => None,
        };
        handler.executed = Some(result.unwrap_or(own));
        if result.is_none() {
            self.record_effect(w, &b, owner);
        }
        w.workers.push(Worker::Busy(b));
    }
}

impl Model for IdempoModel {
    type State = World;
    type Action = Act;

    fn init_states(&self) -> Vec<World> {
        vec![World {
            now: 0,
            store: vec![None; self.scopes.len()],
            workers: vec![Worker::Idle; usize::from(self.bounds.workers)],
            clients: vec![
                Client {
                    attempts: 0,
                    phase: ClientPhase::Ready,
                };
                self.clients.len()
            ],
            next_token: 1,
            crashes: 0,
            faults: 0,
            cache: if self.bounds.cache.is_some() {
                vec![None; self.scopes.len()]
            } else {
                Vec::new()
            },
            filling: if self.bounds.cache.is_some() {
                vec![None; self.scopes.len()]
            } else {
                Vec::new()
            },
            cleanups: Vec::new(),
            ghost: Ghost {
                epoch: vec![0; self.scopes.len()],
                ..Ghost::default()
            },
        }]
    }

    fn actions(&self, w: &World, actions: &mut Vec<Act>) {
        let idle = w.workers.iter().any(|x| matches!(x, Worker::Idle));
        for (c, client) in w.clients.iter().enumerate() {
            let c = u8::try_from(c).unwrap_or(u8::MAX);
            match client.phase {
                ClientPhase::Ready if idle => actions.push(Act::Send(c)),
                ClientPhase::Waiting(_) => actions.push(Act::Timeout(c)),
                _ => {}
            }
        }
        for x in &w.workers {
            let Worker::Busy(b) = x else { continue };
            match &b.pending {
                Some(op) => {
                    let s = self.scope_of(b.client);
                    let blocked = self.mode == EffectMode::Transactional
                        && self
                            .scopes
                            .get(usize::from(s))
                            .is_some_and(|sc| sc == op_scope(op))
                        && Self::locked_by_other(w, s, b.token, self);
                    if !blocked {
                        actions.push(Act::Store(b.token));
                        if w.faults < self.bounds.store_faults {
                            actions.push(Act::StoreFail(b.token));
                            if self.lost_differs(b, op) {
                                actions.push(Act::StoreLost(b.token));
                            }
                        }
                    } else if matches!(op, StoreOp::Claim { .. }) {
                        // The duplicate's claim waits on the row lock; it may time out.
                        actions.push(Act::LockWait(b.token));
                    }
                }
                None => {
                    if let Some(h) = &b.handler {
                        let transactional = self.mode == EffectMode::Transactional;
                        if h.executed.is_none() && !transactional {
                            actions.push(Act::Execute(b.token));
                        }
                        if h.executed.is_some() || transactional {
                            actions.push(Act::Finish(b.token));
                        }
                        if self.bounds.failures {
                            actions.push(Act::Fail(b.token));
                        }
                        if h.heartbeat {
                            actions.push(Act::Heartbeat(b.token));
                        }
                    }
                }
            }
            if w.crashes < self.bounds.max_crashes {
                actions.push(Act::Crash(b.token));
            }
        }
        for c in &w.cleanups {
            actions.push(Act::Cleanup(c.token));
        }
        if w.now < self.bounds.t_max {
            actions.push(Act::Tick);
        }
        for s in 0..w.cache.len() {
            let si = u8::try_from(s).unwrap_or(u8::MAX);
            if self.cache_fillable(w, s) {
                actions.push(Act::CacheRead(si));
            }
            if w.filling[s].is_some() {
                actions.push(Act::CacheWrite(si));
            }
        }
        if self.bounds.purge {
            let now_ms = Self::now_ms(w);
            for (s, slot) in w.store.iter().enumerate() {
                let locked = w.workers.iter().any(|x| {
                    matches!(x, Worker::Busy(b) if b.tx.is_some() && usize::from(self.scope_of(b.client)) == s)
                });
                if !locked && slot.as_ref().is_some_and(|r| store::purgeable(r, now_ms)) {
                    actions.push(Act::Purge(u8::try_from(s).unwrap_or(u8::MAX)));
                }
            }
        }
    }

    fn next_state(&self, last: &World, action: Act) -> Option<World> {
        let mut w = last.clone();
        match action {
            Act::Send(c) => {
                let idle = w.workers.iter().position(|x| matches!(x, Worker::Idle))?;
                w.workers.remove(idle);
                let token = w.next_token;
                w.next_token = w.next_token.checked_add(1)?;
                let client = &mut w.clients[usize::from(c)];
                client.attempts += 1;
                client.phase = ClientPhase::Waiting(token);
                if self.cache_answers(&mut w, c, token) {
                    w.workers.push(Worker::Idle);
                    Self::canonical(&mut w);
                    return Some(w);
                }
                let s = usize::from(self.scope_of(c));
                let (flow, first) = ServerFlow::start(
                    self.scopes[s],
                    self.fingerprints[usize::from(self.fp_of(c))].clone(),
                    Arc::clone(&self.config),
                    token_bytes(token),
                );
                let b = Box::new(Busy {
                    token,
                    client: c,
                    flow: FlowKey(flow),
                    pending: None,
                    handler: None,
                    epoch: 0,
                    took_over: false,
                    tx: None,
                    read: None,
                    admitted: false,
                    admission_fault: false,
                    lock_waited: false,
                });
                self.apply(&mut w, b, first, None);
            }
            Act::Timeout(c) => {
                let mut seen = w.ghost.seen;
                self.client_decides(
                    &mut w.clients[usize::from(c)],
                    &AttemptOutcome::Timeout,
                    &mut seen,
                );
                w.ghost.seen = seen;
            }
            Act::Store(t)
            | Act::Execute(t)
            | Act::Finish(t)
            | Act::Fail(t)
            | Act::Heartbeat(t)
            | Act::Crash(t)
            | Act::StoreFail(t)
            | Act::StoreLost(t) => {
                let i = Self::busy_index(&w, t)?;
                let Worker::Busy(b) = w.workers.remove(i) else {
                    return None;
                };
                match action {
                    Act::Store(_) => self.store_step(&mut w, b, Fault::None),
                    Act::StoreFail(_) => self.store_step(&mut w, b, Fault::Failed),
                    Act::StoreLost(_) => self.store_step(&mut w, b, Fault::Lost),
                    Act::Execute(_) => self.execute(&mut w, b),
                    Act::Finish(_) => {
                        let body = b
                            .handler
                            .as_ref()
                            .and_then(|h| h.executed)
                            .unwrap_or((b.token, b.client));
                        let response = HandlerResponse {
                            status: 201,
                            headers: vec![("content-type".into(), "application/json".into())],
                            body: vec![body.0, body.1],
                            ..HandlerResponse::new(201, vec![], vec![])
                        };
                        self.feed(&mut w, b, Event::HandlerFinished(response), None);
                    }
                    Act::Fail(_) => {
                        let maybe_side_effect = self.mode != EffectMode::Transactional
                            && b.handler.as_ref().is_some_and(|h| h.executed.is_some());
                        self.feed(&mut w, b, Event::HandlerFailed { maybe_side_effect }, None);
                    }
                    Act::Heartbeat(_) => self.feed(&mut w, b, Event::HeartbeatDue, None),
                    _ => {
                        self.close_tx(&mut w, &b);
                        w.crashes += 1;
                        w.workers.push(Worker::Idle);
                    }
                }
            }
            Act::Tick => {
                w.now += 1;
                // Redis drops an entry at its deadline.
                let now_ms = Self::now_ms(&w);
                for entry in &mut w.cache {
                    if entry.as_ref().is_some_and(|e| e.record.is_expired(now_ms)) {
                        *entry = None;
                    }
                }
            }
            Act::Purge(s) => w.store[usize::from(s)] = None,
            Act::CacheRead(s) => self.cache_read(&mut w, usize::from(s)),
            Act::CacheWrite(s) => self.cache_write(&mut w, usize::from(s)),
            Act::Cleanup(t) => {
                let i = w.cleanups.iter().position(|c| c.token == t)?;
                let c = w.cleanups.remove(i);
                self.cleanup_step(&mut w, &c);
            }
            Act::LockWait(t) => {
                let i = Self::busy_index(&w, t)?;
                let Worker::Busy(mut b) = w.workers.remove(i) else {
                    return None;
                };
                b.pending = None;
                b.lock_waited = true;
                let now_ms = Self::now_ms(&w);
                // What the store adapter reports for a lock wait past its timeout: core's own
                // result (answered 409 in-flight), or under the mutation a claim that "worked".
                let event = if self.variant == Variant::LockWaitAssumedClaimed {
                    Event::Store(StoreResult::Claimed {
                        generation: 1,
                        now_ms,
                    })
                } else {
                    Event::Store(StoreResult::Locked { now_ms })
                };
                self.feed(&mut w, b, event, None);
            }
        }
        Self::canonical(&mut w);
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        props::all()
    }
}
