//! The properties checked on [`IdempoModel`](super::IdempoModel).
//!
//! Properties about one state (P1, P5, P6, P8e) read the store and the ghost directly. Properties
//! about an answer, a write or a handler start (P2, P3, P4, P5a, P7, P7x, P8, P9, P10, F) are
//! monitors: the transition that answers, writes or starts a handler evaluates them on the facts
//! of that moment ([`Answer`], the slot before a write, the flow's admission) and sets a [`Check`]
//! bit in the ghost when they fail; the `always` property is "that bit is clear". `sometimes`
//! properties (vacuity witnesses) read [`Seen`] bits.
use idempo_core::machine::Outcome;
use idempo_core::record::{FencingToken, Record, RecordState};
use stateright::Property;

pub use super::contract::{C1, C1O, C1R, C2, C3, C4};
use super::{Body, IdempoModel, World};

/// P1: at most one side effect per (scope, key, generation instance).
pub const P1: &str = "P1 at most one execution per generation";
/// P2: a replay returns exactly the response stored for that generation, from a run of the
/// same request.
pub const P2: &str = "P2 a replay is the stored response of a matching run";
/// P3: a request answered 422 never ran its handler.
pub const P3: &str = "P3 a mismatch never executes";
/// P4: every success answered carries the result of an execution of that same request.
pub const P4: &str = "P4 no success for a body that did not run";
/// P5: once completed, a record's response never changes.
pub const P5: &str = "P5 a completed response never changes";
/// P5a: all successes answered within one generation carry the same result.
pub const P5A: &str = "P5a successes agree within a generation";
/// P6: two scopes sharing a raw key never see each other's records or results.
pub const P6: &str = "P6 scopes never see each other";
/// P7: a 409 is answered only while the record has a live lease.
pub const P7: &str = "P7 409 only while a live lease exists";
/// P7x: an in-progress record whose lease has expired is never answered 409.
pub const P7X: &str = "P7x an expired lease is never answered 409";
/// P8: only the current token holder's completion, renewal or release succeeds.
pub const P8: &str = "P8 a stale owner never writes";
/// P8e: side effects happen only while the executor holds the record's current token.
pub const P8E: &str = "P8e only the current owner executes";
/// P9: fail closed. A handler starts only after the store confirmed the flow's claim or
/// takeover, and a store failure during admission is answered 503 `store-unavailable` with
/// `Retry-After`, the handler not run.
pub const P9: &str = "P9 a store failure fails closed";
/// P10: a replay served from the cache is the current generation's stored response: the store
/// holds that live, completed record at the moment of the answer.
pub const P10: &str = "P10 a cached replay is the live generation's response";
/// F: the flow accepts every event the host feeds it and its encodings decode.
pub const F: &str = "F the flow accepts every host event";

/// Witness: a stored response was replayed.
pub const W_REPLAY: &str = "W replay served";
/// Witness: a 409 was answered.
pub const W_IN_FLIGHT: &str = "W 409 answered";
/// Witness: a 422 was answered.
pub const W_MISMATCH: &str = "W 422 answered";
/// Witness: the outcome-unknown problem was answered.
pub const W_OUTCOME_UNKNOWN: &str = "W outcome unknown answered";
/// Witness: a flow that took an expired lease over stored its response.
pub const W_TAKEOVER: &str = "W takeover completed";
/// Witness: a completion was rejected (its token was no longer current).
pub const W_STALE_REJECTED: &str = "W stale completion rejected";
/// Witness: a key ran again in a later generation instance (after its TTL).
pub const W_RERUN_TTL: &str = "W re-run after TTL";
/// Witness: a client stopped because its attempts were used up.
pub const W_EXHAUSTED: &str = "W retries exhausted";
/// Witness: both scopes held a live record at once.
pub const W_BOTH_SCOPES: &str = "W both scopes live";
/// Witness: a 503 `store-unavailable` was answered.
pub const W_STORE_UNAVAILABLE: &str = "W 503 store unavailable answered";
/// Witness: a record left by a claim or takeover whose answer was lost was taken over, marked
/// outcome-unknown, or replaced after expiry.
pub const W_ORPHAN_RESOLVED: &str = "W ambiguous claim resolved";
/// Witness: the host's background cleanup (core's `ServerFlow::cleanup`) released (or expired)
/// a record left by a claim or takeover whose answer was lost.
pub const W_ORPHAN_CLEANED: &str = "W lost claim cleaned up by the host";
/// Witness: a transactional duplicate waited past the lock timeout and got core's 409.
pub const W_LOCK_WAIT: &str = "W lock wait answered 409";
/// Witness: a replay was served from the cache.
pub const W_CACHE_HIT: &str = "W cache replay served";
/// Witness: another body got 422 from a cached record.
pub const W_CACHE_MISMATCH: &str = "W cache 422 answered";

/// Monitor bits (set when the named property fails at a transition).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// [`F`].
    Flow = 1,
    /// [`P6`] (a flow addressed another scope, or a result crossed scopes).
    Scopes = 1 << 1,
    /// [`P2`].
    Replay = 1 << 2,
    /// [`P3`].
    Mismatch = 1 << 3,
    /// [`P4`].
    Success = 1 << 4,
    /// [`P5A`].
    Agree = 1 << 5,
    /// [`P7`].
    LiveLease = 1 << 6,
    /// [`P7X`].
    ExpiredLease = 1 << 7,
    /// [`P8`].
    StaleWrite = 1 << 8,
    /// [`P9`].
    FailClosed = 1 << 9,
    /// [`P10`].
    Cache = 1 << 10,
    /// [`C1`](super::contract::C1).
    Once = 1 << 11,
    /// [`C1O`](super::contract::C1O).
    OnceOwners = 1 << 12,
    /// [`C1R`](super::contract::C1R).
    OnceReRun = 1 << 13,
    /// [`C2`](super::contract::C2).
    ReplayStored = 1 << 14,
    /// [`C3`](super::contract::C3).
    Fencing = 1 << 15,
    /// [`C4`](super::contract::C4).
    Conditional = 1 << 16,
}

impl Check {
    /// The bit.
    #[must_use]
    pub fn bit(self) -> u32 {
        self as u32
    }
}

/// Witness bits.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// [`W_REPLAY`].
    Replay = 1,
    /// [`W_IN_FLIGHT`].
    InFlight = 1 << 1,
    /// [`W_MISMATCH`].
    Mismatch = 1 << 2,
    /// [`W_OUTCOME_UNKNOWN`].
    OutcomeUnknown = 1 << 3,
    /// [`W_TAKEOVER`].
    TakeoverCompleted = 1 << 4,
    /// [`W_STALE_REJECTED`].
    StaleCompletionRejected = 1 << 5,
    /// [`W_RERUN_TTL`].
    RerunAfterTtl = 1 << 6,
    /// [`W_EXHAUSTED`].
    RetriesExhausted = 1 << 7,
    /// [`W_STORE_UNAVAILABLE`].
    StoreUnavailable = 1 << 8,
    /// [`W_ORPHAN_RESOLVED`].
    OrphanResolved = 1 << 9,
    /// [`W_CACHE_HIT`].
    CacheHit = 1 << 10,
    /// [`W_CACHE_MISMATCH`].
    CacheMismatch = 1 << 11,
    /// [`W_ORPHAN_CLEANED`].
    OrphanCleaned = 1 << 12,
    /// [`W_LOCK_WAIT`].
    LockWait = 1 << 13,
}

impl Seen {
    /// The bit.
    #[must_use]
    pub fn bit(self) -> u32 {
        self as u32
    }
}

/// The facts of one answer, taken in the step that produced it.
#[derive(Clone, Debug)]
pub struct Answer {
    /// Recipient.
    pub client: u8,
    /// Token of the answering flow.
    pub token: u8,
    /// Recipient's scope.
    pub scope: u8,
    /// HTTP status.
    pub status: u16,
    /// The flow's outcome.
    pub outcome: Outcome,
    /// The handler result in the body, for a 201.
    pub body: Option<Body>,
    /// `Idempotent-Replayed: true` present.
    pub replay_header: bool,
    /// The answer is core's 503 `store-unavailable` problem with `Retry-After`.
    pub store_unavailable: bool,
    /// Generation instance the answer belongs to (the read record's for a replay, the flow's
    /// own otherwise).
    pub epoch: u8,
    /// Whether this flow was told to run the handler.
    pub ran_handler: bool,
    /// Whether this flow took an expired lease over.
    pub took_over: bool,
    /// Whether a store operation of this flow's admission failed.
    pub admission_fault: bool,
    /// Whether this flow's claim waited on another request's row lock past the lock timeout
    /// (transactional mode): its 409 is owed to that live transaction, not to a stored lease.
    pub lock_waited: bool,
    /// The recipient scope's slot at the moment of the answer.
    pub record: Option<Record>,
    /// The store's time at the moment of the answer.
    pub now_ms: u64,
}

/// Evaluates the answer monitors and witnesses.
pub fn check_answer(model: &IdempoModel, w: &mut World, a: &Answer) {
    let g = &mut w.ghost;
    let mut fail = |c: Check| g.violated |= c.bit();
    let mut seen = 0u32;
    match a.outcome {
        Outcome::Replayed => {
            seen |= Seen::Replay.bit();
            let ok = a.replay_header
                && a.body.is_some_and(|b| {
                    g.completed.get(&(a.scope, a.epoch)) == Some(&b)
                        && model.same_request(b.1, a.client)
                });
            if !ok {
                fail(Check::Replay);
            }
        }
        Outcome::Mismatch => {
            seen |= Seen::Mismatch.bit();
            if a.ran_handler || g.effects.iter().any(|e| e.token == a.token) {
                fail(Check::Mismatch);
            }
        }
        Outcome::InFlight if a.lock_waited => {
            // The row lock of another request's open transaction (only a live process holds
            // one: a crash rolls it back). The uncommitted claim is invisible, so no lease is
            // checked; the flow must not have run the handler.
            seen |= Seen::LockWait.bit();
            if a.ran_handler {
                fail(Check::Flow);
            }
        }
        Outcome::InFlight => {
            seen |= Seen::InFlight.bit();
            let lease = a.record.as_ref().and_then(|r| match r.state {
                RecordState::InProgress { lease_until_ms } if !r.is_expired(a.now_ms) => {
                    Some(lease_until_ms)
                }
                _ => None,
            });
            match lease {
                Some(until) if until > a.now_ms => {}
                Some(_) => {
                    fail(Check::LiveLease);
                    fail(Check::ExpiredLease);
                }
                None => fail(Check::LiveLease),
            }
        }
        Outcome::OutcomeUnknown => seen |= Seen::OutcomeUnknown.bit(),
        Outcome::Stored if a.took_over => seen |= Seen::TakeoverCompleted.bit(),
        _ => {}
    }
    if a.store_unavailable {
        seen |= Seen::StoreUnavailable.bit();
    }
    if a.admission_fault && (!a.store_unavailable || a.ran_handler) {
        fail(Check::FailClosed);
    }
    if (200..300).contains(&a.status) {
        match a.body {
            Some(b) => {
                let ran = g.effects.iter().any(|e| e.token == b.0);
                if !ran || !model.same_request(b.1, a.client) {
                    fail(Check::Success);
                }
                if model.scope_of(b.1) != a.scope {
                    fail(Check::Scopes);
                }
                let first = *g.answered.entry((a.scope, a.epoch)).or_insert(b);
                if first != b {
                    fail(Check::Agree);
                }
            }
            None => fail(Check::Success),
        }
    }
    g.seen |= seen;
}

/// P10 monitor: a replay with `body` was served at `now_ms` from the cache `entry` of scope `s`.
pub fn check_cache_replay(
    w: &mut World,
    s: usize,
    entry: &super::Cached,
    body: Option<Body>,
    now_ms: u64,
) {
    let live = w.store.get(s).and_then(Option::as_ref).is_some_and(|r| {
        !r.is_expired(now_ms)
            && r.generation == entry.record.generation
            && matches!(&r.state, RecordState::Completed { response }
                if body.is_some() && super::body_of(&response.body) == body)
    });
    let current = w.ghost.epoch.get(s) == Some(&entry.epoch);
    if !(live && current) {
        w.ghost.violated |= Check::Cache.bit();
    }
}

/// P8 monitor: a completion, renewal or release with `token` succeeded on the slot `pre`.
pub fn check_owner_write(w: &mut World, pre: &Option<Record>, token: FencingToken) {
    let owned = pre
        .as_ref()
        .is_some_and(|r| r.token == token && matches!(r.state, RecordState::InProgress { .. }));
    if !owned {
        w.ghost.violated |= Check::StaleWrite.bit();
    }
}

fn clear<const BIT: u32>(_: &IdempoModel, w: &World) -> bool {
    w.ghost.violated & BIT == 0
}

fn seen<const BIT: u32>(_: &IdempoModel, w: &World) -> bool {
    w.ghost.seen & BIT != 0
}

fn one_effect_per_generation(_: &IdempoModel, w: &World) -> bool {
    w.ghost
        .effects
        .windows(2)
        .all(|p| (p[0].scope, p[0].epoch) != (p[1].scope, p[1].epoch))
}

fn completed_unchanged(_: &IdempoModel, w: &World) -> bool {
    w.store.iter().enumerate().all(|(s, slot)| match slot {
        Some(Record {
            state: RecordState::Completed { response },
            ..
        }) => {
            let s = u8::try_from(s).unwrap_or(u8::MAX);
            let epoch = w.ghost.epoch.get(usize::from(s)).copied().unwrap_or(0);
            super::body_of(&response.body).is_some()
                && w.ghost.completed.get(&(s, epoch)).copied() == super::body_of(&response.body)
        }
        _ => true,
    })
}

fn scopes_isolated(m: &IdempoModel, w: &World) -> bool {
    if w.ghost.violated & Check::Scopes.bit() != 0 {
        return false;
    }
    // Every record holds a fingerprint some client of its own scope sends.
    w.store.iter().enumerate().all(|(s, slot)| {
        slot.as_ref().is_none_or(|r| {
            (0..m.clients.len()).any(|c| {
                let c = u8::try_from(c).unwrap_or(u8::MAX);
                usize::from(m.scope_of(c)) == s
                    && m.fingerprint_of(c).is_some_and(|f| *f == r.fingerprint)
            })
        })
    })
}

fn owner_executes(_: &IdempoModel, w: &World) -> bool {
    w.ghost.effects.iter().all(|e| e.owner)
}

fn both_scopes_live(_: &IdempoModel, w: &World) -> bool {
    let now_ms = u64::from(w.now) * super::TICK_MS;
    w.store
        .iter()
        .filter(|s| s.as_ref().is_some_and(|r| !r.is_expired(now_ms)))
        .count()
        >= 2
}

/// The safety properties, in a fixed order.
#[must_use]
pub fn safety() -> Vec<Property<IdempoModel>> {
    vec![
        Property::always(P1, one_effect_per_generation),
        Property::always(P2, clear::<{ Check::Replay as u32 }>),
        Property::always(P3, clear::<{ Check::Mismatch as u32 }>),
        Property::always(P4, clear::<{ Check::Success as u32 }>),
        Property::always(P5, completed_unchanged),
        Property::always(P5A, clear::<{ Check::Agree as u32 }>),
        Property::always(P6, scopes_isolated),
        Property::always(P7, clear::<{ Check::LiveLease as u32 }>),
        Property::always(P7X, clear::<{ Check::ExpiredLease as u32 }>),
        Property::always(P8, clear::<{ Check::StaleWrite as u32 }>),
        Property::always(P8E, owner_executes),
        Property::always(P9, clear::<{ Check::FailClosed as u32 }>),
        Property::always(P10, clear::<{ Check::Cache as u32 }>),
        Property::always(F, clear::<{ Check::Flow as u32 }>),
        Property::always(C1, clear::<{ Check::Once as u32 }>),
        Property::always(C1O, clear::<{ Check::OnceOwners as u32 }>),
        Property::always(C1R, clear::<{ Check::OnceReRun as u32 }>),
        Property::always(C2, clear::<{ Check::ReplayStored as u32 }>),
        Property::always(C3, clear::<{ Check::Fencing as u32 }>),
        Property::always(C4, clear::<{ Check::Conditional as u32 }>),
    ]
}

/// The vacuity witnesses, in a fixed order.
#[must_use]
pub fn witnesses() -> Vec<Property<IdempoModel>> {
    vec![
        Property::sometimes(W_REPLAY, seen::<{ Seen::Replay as u32 }>),
        Property::sometimes(W_IN_FLIGHT, seen::<{ Seen::InFlight as u32 }>),
        Property::sometimes(W_MISMATCH, seen::<{ Seen::Mismatch as u32 }>),
        Property::sometimes(W_OUTCOME_UNKNOWN, seen::<{ Seen::OutcomeUnknown as u32 }>),
        Property::sometimes(W_TAKEOVER, seen::<{ Seen::TakeoverCompleted as u32 }>),
        Property::sometimes(
            W_STALE_REJECTED,
            seen::<{ Seen::StaleCompletionRejected as u32 }>,
        ),
        Property::sometimes(W_RERUN_TTL, seen::<{ Seen::RerunAfterTtl as u32 }>),
        Property::sometimes(W_EXHAUSTED, seen::<{ Seen::RetriesExhausted as u32 }>),
        Property::sometimes(W_BOTH_SCOPES, both_scopes_live),
        Property::sometimes(
            W_STORE_UNAVAILABLE,
            seen::<{ Seen::StoreUnavailable as u32 }>,
        ),
        Property::sometimes(W_ORPHAN_RESOLVED, seen::<{ Seen::OrphanResolved as u32 }>),
        Property::sometimes(W_CACHE_HIT, seen::<{ Seen::CacheHit as u32 }>),
        Property::sometimes(W_CACHE_MISMATCH, seen::<{ Seen::CacheMismatch as u32 }>),
        Property::sometimes(W_ORPHAN_CLEANED, seen::<{ Seen::OrphanCleaned as u32 }>),
        Property::sometimes(W_LOCK_WAIT, seen::<{ Seen::LockWait as u32 }>),
    ]
}

/// Every property: [`safety`] then [`witnesses`].
#[must_use]
pub fn all() -> Vec<Property<IdempoModel>> {
    let mut v = safety();
    v.extend(witnesses());
    v
}
