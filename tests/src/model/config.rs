//! The configuration of one model: effect mode, mutation variant, clients and bounds.
use idempo_core::policy::TakeoverPolicy;

/// How the handler's business side effect relates to the idempotency store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EffectMode {
    /// The effect commits in the same database transaction as the claim and the completion
    /// (`BEGIN; claim; <writes>; complete; COMMIT`): other requests for the scope wait on the row
    /// lock, a crash rolls everything back. The route runs core's transactional mode
    /// (`Config::transactional`: the flow asks for the `COMMIT`). Takeover policy re-run.
    Transactional,
    /// The effect is an external call carrying the flow's
    /// [`DownstreamKey`](idempo_core::machine::DownstreamKey); the downstream service deduplicates
    /// on it (forever, in the model). Takeover policy re-run.
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
    /// Core's abandon (renew with 0 ms after a handler that may have acted failed) done as a
    /// release: a retry of the same request runs it again at once.
    AbandonReleases,
    /// Core's `takeover` renews the lease but leaves the old token in the record: the paused
    /// owner still holds the key, the new one is fenced out.
    TakeoverKeepsToken,
    /// Core's `renew` without the token comparison: a stale owner's heartbeat renews the lease
    /// of the flow that took its record over.
    RenewWithoutToken,
    /// The host runs the handler's side effect before the store is consulted (optimistic
    /// execution), then lets the flow answer.
    ExecuteBeforeAdmission,
    /// Core's `complete` with no condition at all (Powertools' `_update_record`): any flow's
    /// completion overwrites the record, a completed one included.
    CompleteUnconditional,
    /// The host builds every request's scope from the first client's principal.
    ScopeOfFirstClient,
    /// The store adapter reads an in-progress record's lease as its retention (`lease_until`
    /// taken from `expires_at`): an expired lease looks live.
    LeaseReadAsExpiry,
    /// The store adapter maps a completion's answer to the wrong result type (a `Got`).
    ResultMisreported,
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
