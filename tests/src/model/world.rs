//! The model state: workers and their flows, clients, the store, the cache, pending cleanups and
//! the ghost variables that turn history into state, and the actions that change it.
use super::FlowKey;
use idempo_core::machine::{DownstreamKey, StoreOp};
use idempo_core::record::Record;
use std::collections::BTreeMap;

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
    /// Whether the executing flow took an expired lease over.
    pub took_over: bool,
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
    /// Transactional mode: the response the completion wrote in the open transaction (stored
    /// for the contract only once the `COMMIT` applies).
    pub stored: Option<Body>,
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
    /// The contract's latest granted token before the claim.
    pub pre_granted: u8,
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
    /// Violations seen at transitions (bits of [`Check`](super::props::Check)).
    pub violated: u32,
    /// Events seen (bits of [`Seen`](super::props::Seen)).
    pub seen: u32,
    /// Contract history (`contract`): the open retention windows of requests that had an
    /// effect, by (scope, fingerprint index, made by the current owner), each open until the
    /// `expires_at` of that request's record as last written (ms).
    pub windows: BTreeMap<(u8, u8, bool), u64>,
    /// Contract history: the last response stored (committed) per (scope, fingerprint index).
    pub stored: BTreeMap<(u8, u8), Body>,
    /// Contract history: per scope, the token of the latest claim or takeover the store ever
    /// applied (0: none), whether or not its answer arrived.
    pub granted: Vec<u8>,
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

pub(super) fn token_bytes(token: u8) -> [u8; 16] {
    let mut e = [0u8; 16];
    e[0] = 0x7e;
    e[15] = token;
    e
}

pub(super) fn body_of(bytes: &[u8]) -> Option<Body> {
    match bytes {
        [t, c] => Some((*t, *c)),
        _ => None,
    }
}
