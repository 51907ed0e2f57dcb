//! The sans-IO server flow (quinn-proto style): events in, plain-data actions out.
//!
//! One [`ServerFlow`] handles one request that carries a valid key. The host:
//!
//! 1. computes the [`ScopeId`] and the request fingerprint, draws 16 bytes of entropy, and calls
//!    [`ServerFlow::start`], which returns the first [`Action`];
//! 2. executes each action and feeds the result back with [`ServerFlow::handle`]:
//!    - [`Action::Store`]: run the [`StoreOp`] atomically, feed [`Event::Store`] with the matching
//!      [`StoreResult`], or [`Event::StoreFailed`] on any store error;
//!    - [`Action::RunHandler`]: run the handler; while it runs, feed [`Event::HeartbeatDue`] every
//!      [`RunHandler::heartbeat_ms`] (and execute the renew it returns); when it ends feed
//!      [`Event::HandlerFinished`] or [`Event::HandlerFailed`];
//!    - [`Action::Wait`]: nothing to do, keep waiting for the handler;
//!    - [`Action::LeaseLost`]: another request took the key over; the host MAY cancel the handler
//!      and keeps waiting for its end as usual;
//!    - [`Action::Respond`]: send the response; the flow is finished;
//!    - [`Action::PropagateError`]: re-raise the handler's error (or render the framework's error
//!      page); the flow is finished.
//! 3. once the flow is finished, asks [`ServerFlow::cleanup`]: when it returns a [`Cleanup`], the
//!    claim (or takeover) the flow sent may have been applied although its answer was lost; the
//!    host runs the cleanup in the background after sending the response (see [`Cleanup`]).
//!
//! Events are fed one at a time: after a store action the next event is its result.
//!
//! **Transactional mode** ([`Config::transactional`]): the host runs every store operation of the
//! flow and the handler's writes in one database transaction. [`StoreOp::Release`] is then the
//! `ROLLBACK`, and [`StoreOp::Commit`] the `COMMIT`; the flow asks for no heartbeat, releases on
//! any handler error, and sends the handler's response only after [`StoreResult::Committed`] (or,
//! for a status that is not stored, after the rollback). A completion or `COMMIT` that fails or
//! does not apply is answered 503 `store-unavailable` ([`Outcome::NotCommitted`]). The host rolls
//! back whatever a store failure left open when it closes the transaction.
//!
//! **One token per flow.** The entropy given to `start` is the fencing token for the claim and,
//! if needed, for a takeover. It is written to the store at most once: once a claim or takeover
//! succeeds the flow owns the record and never claims again. An attempt answered
//! [`Event::StoreFailed`] may still have been applied (a statement sent to a hung server runs when
//! the server resumes): the record then holds this flow's token with no handler behind it, which
//! is what [`ServerFlow::cleanup`] undoes. So a flow needs exactly 16 fresh random bytes.
use std::sync::Arc;

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::capture::not_retained_response;
use super::problem::{ProblemKind, problem_response};
use super::{Decision, decide};
use crate::policy::{Config, KeyRequirement, ResponseOrigin, StoreVerdict, TakeoverPolicy};
use crate::record::{FencingToken, FingerprintText, Record, RecordState, StoredResponse, hex};
use crate::scope::ScopeId;

/// The replay marker header added to every replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The `detail` of the 503 answered when a transactional handler's writes did not commit.
const NOT_COMMITTED_DETAIL: &str = "The request's transaction did not commit, so nothing it did \
    was recorded. Retry with the same key: it replays the response if the commit did happen.";

/// An HTTP response for the host to send.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Header fields, in order (names lowercase for responses idempo builds).
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// What the handler returned.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HandlerResponse {
    /// Status code.
    pub status: u16,
    /// All header fields; only allow-listed ones are stored, all are sent to the live client.
    pub headers: Vec<(String, String)>,
    /// The body sent to the live client.
    pub body: Vec<u8>,
    /// The redaction hook's output: when `Some`, this body is stored and replayed instead of
    /// `body` (see [`Redaction::HostHook`](crate::policy::Redaction::HostHook)).
    pub body_to_store: Option<Vec<u8>>,
    /// Who produced the response: [`ResponseOrigin::Framework`] when the framework rejected the
    /// request before the handler ran (never stored, `spec/PROTOCOL.md` §9).
    pub origin: ResponseOrigin,
    /// True when the host stopped recording the body at the capture limit
    /// ([`BodyCapture::truncated`](super::BodyCapture::truncated)): `body` is then not the whole
    /// body (the client got it streamed), and a storable response is completed with the
    /// `response-not-retained` problem (`spec/PROTOCOL.md` §7.5).
    pub body_truncated: bool,
}

impl HandlerResponse {
    /// A handler's response with the whole body, no redacted copy, origin
    /// [`ResponseOrigin::Handler`].
    #[must_use]
    pub fn new(status: u16, headers: Vec<(String, String)>, body: Vec<u8>) -> Self {
        Self {
            status,
            headers,
            body,
            body_to_store: None,
            origin: ResponseOrigin::Handler,
            body_truncated: false,
        }
    }

    fn into_http(self) -> HttpResponse {
        HttpResponse {
            status: self.status,
            headers: self.headers,
            body: self.body,
        }
    }
}

/// The idempotency key a handler passes to a downstream service for its side effect.
///
/// Derived from (scope, fingerprint, generation), never from the fencing token, so a takeover
/// re-run sends the same downstream key and the downstream service deduplicates; a new generation
/// (after the record expired) gets a new one. The fingerprint is part of it because a generation
/// restarts at 1 once a record was purged or released: without it, another body under the same key
/// would reuse the old downstream key and be answered with the old effect's result (found by the
/// model checker, `spec/MODEL.md` §4). 64 lowercase hex characters; append a suffix such as
/// `:charge` when a handler makes several downstream calls.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DownstreamKey(String);

impl DownstreamKey {
    /// The key text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for DownstreamKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `hex(SHA-256("idempo-downstream-v2" ‖ 0x00 ‖ scope (32 bytes) ‖ len(fingerprint) (u32 BE) ‖
/// fingerprint text ‖ generation (u32 BE)))`.
#[must_use]
pub fn downstream_key(
    scope: &ScopeId,
    fingerprint: &FingerprintText,
    generation: u32,
) -> DownstreamKey {
    let fingerprint = fingerprint.as_str().as_bytes();
    // FingerprintText is at most 200 bytes, so the length always fits.
    let fingerprint_len = u32::try_from(fingerprint.len()).unwrap_or(u32::MAX);
    let mut h = Sha256::new();
    h.update(b"idempo-downstream-v2\0");
    h.update(scope.as_bytes());
    h.update(fingerprint_len.to_be_bytes());
    h.update(fingerprint);
    h.update(generation.to_be_bytes());
    DownstreamKey(hex(&h.finalize()))
}

/// The replay of a stored response: its status, headers and body plus `Idempotent-Replayed: true`.
#[must_use]
pub fn replay_response(stored: &StoredResponse) -> HttpResponse {
    replay_owned(stored.clone())
}

fn replay_owned(stored: StoredResponse) -> HttpResponse {
    let mut headers = stored.headers;
    headers.push((REPLAYED_HEADER.to_owned(), "true".to_owned()));
    HttpResponse {
        status: stored.status,
        headers,
        body: stored.body,
    }
}

/// What to do with a request that has no `Idempotency-Key`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum MissingKey {
    /// Answer with this 400 problem.
    Reject(HttpResponse),
    /// The key is optional on this route: run the handler without idempotency protection.
    RunUnprotected,
}

/// The answer for a request without a key, per [`Config::key`].
pub fn missing_key(config: &Config) -> MissingKey {
    match config.key {
        KeyRequirement::Required => {
            MissingKey::Reject(problem_response(ProblemKind::MissingKey, None, None, None))
        }
        KeyRequirement::Optional => MissingKey::RunUnprotected,
    }
}

/// A storage primitive to execute atomically (`spec/STORAGE.md` §3).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// Primitive 1; answer [`StoreResult::Claimed`] or [`StoreResult::Existing`].
    Claim {
        /// Record key.
        scope: ScopeId,
        /// Fingerprint to store.
        fingerprint: FingerprintText,
        /// Token to store.
        token: FencingToken,
        /// Lease length.
        lease_ms: u64,
        /// Retention.
        ttl_ms: u64,
    },
    /// Primitive 2; answer [`StoreResult::Got`].
    Get {
        /// Record key.
        scope: ScopeId,
    },
    /// Primitive 3; answer [`StoreResult::TookOver`].
    TakeOver {
        /// Record key.
        scope: ScopeId,
        /// Token the record must still hold.
        seen_token: FencingToken,
        /// Token to write.
        new_token: FencingToken,
        /// Lease length.
        lease_ms: u64,
    },
    /// Primitive 4; answer [`StoreResult::MarkedUnknown`].
    MarkUnknown {
        /// Record key.
        scope: ScopeId,
        /// Token the record must still hold.
        seen_token: FencingToken,
        /// Retention of the terminal record.
        ttl_ms: u64,
    },
    /// Primitive 5; answer [`StoreResult::Completed`].
    Complete {
        /// Record key.
        scope: ScopeId,
        /// The owner's token.
        token: FencingToken,
        /// The encoded [`StoredResponse`] (the `response` column).
        response: Vec<u8>,
        /// Retention.
        ttl_ms: u64,
    },
    /// Primitive 6; answer [`StoreResult::Released`].
    Release {
        /// Record key.
        scope: ScopeId,
        /// The owner's token.
        token: FencingToken,
    },
    /// Primitive 7; answer [`StoreResult::Renewed`]. `lease_ms` may be 0 (expire own lease).
    Renew {
        /// Record key.
        scope: ScopeId,
        /// The owner's token.
        token: FencingToken,
        /// New lease length from the store's now.
        lease_ms: u64,
    },
    /// Transactional mode only: `COMMIT` the request's transaction (the record as written so far
    /// and the handler's writes); answer [`StoreResult::Committed`], or [`Event::StoreFailed`]
    /// when the commit failed or its result is unknown.
    Commit {
        /// Record key.
        scope: ScopeId,
    },
}

/// The result of a [`StoreOp`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StoreResult {
    /// Claim inserted a new record.
    Claimed {
        /// Its generation.
        generation: u32,
        /// The store's clock.
        now_ms: u64,
    },
    /// Claim found a live record.
    Existing {
        /// The record.
        record: Record,
        /// The store's clock.
        now_ms: u64,
    },
    /// Get's answer (an expired record may be returned; it counts as absent).
    Got {
        /// The record, if any.
        record: Option<Record>,
        /// The store's clock.
        now_ms: u64,
    },
    /// Takeover's answer: the generation when it applied.
    TookOver(Option<u32>),
    /// Mark-unknown's answer: whether it applied.
    MarkedUnknown(bool),
    /// Complete's answer: whether it applied.
    Completed(bool),
    /// Release's answer: whether it applied.
    Released(bool),
    /// Renew's answer: whether it applied.
    Renewed(bool),
    /// Commit's answer: the transaction committed.
    Committed,
    /// Transactional mode: the claim (or get) waited for the record's row lock past the store's
    /// lock timeout. The lock belongs to another request's uncommitted claim, in flight by
    /// definition: answered 409 `in-flight` with `Retry-After` (`spec/PROTOCOL.md` §7.6). Nothing
    /// was written.
    Locked {
        /// The store's clock.
        now_ms: u64,
    },
}

/// An input to the flow.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// The result of the last [`Action::Store`].
    Store(StoreResult),
    /// The last [`Action::Store`] failed (connection error, timeout, corrupt row...).
    StoreFailed,
    /// The handler returned a response.
    HandlerFinished(HandlerResponse),
    /// The handler raised an error. `maybe_side_effect`: it may have acted before failing.
    HandlerFailed {
        /// False only when the handler certainly had no effect (e.g. validation before any write).
        maybe_side_effect: bool,
    },
    /// The heartbeat timer fired while the handler runs.
    HeartbeatDue,
}

/// Parameters for running the handler.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RunHandler {
    /// The fencing token this execution owns.
    pub token: FencingToken,
    /// The record's generation.
    pub generation: u32,
    /// Key for downstream side effects (see [`DownstreamKey`]).
    pub downstream_key: DownstreamKey,
    /// Feed [`Event::HeartbeatDue`] at this interval while the handler runs (`None`: never).
    pub heartbeat_ms: Option<u64>,
}

/// How the request ended (for metrics and logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Handler ran; response stored for replays.
    Stored,
    /// Handler ran; status not stored by policy; key released.
    NotStored,
    /// Handler ran; its response was sent but is too large (or not encodable) to retain: the
    /// record was completed with the `response-not-retained` problem, which retries replay.
    NotRetained,
    /// Handler ran; the lease was lost to a takeover, so nothing was written.
    LeaseLost,
    /// Handler ran; the store failed while recording the result.
    CompletionFailed,
    /// Transactional mode: the handler ran but its transaction did not commit (the completion,
    /// a step after it or the `COMMIT` failed or did not apply); answered 503 `store-unavailable`
    /// instead of the handler's response, since its writes were rolled back (or, for a `COMMIT`
    /// whose answer was lost, may have committed: a retry then replays).
    NotCommitted,
    /// Handler raised an error.
    HandlerFailed,
    /// Stored response replayed.
    Replayed,
    /// 409: another request holds a live lease.
    InFlight,
    /// 422: fingerprint mismatch.
    Mismatch,
    /// Outcome-unknown problem answered.
    OutcomeUnknown,
    /// 503: store unavailable before the handler ran.
    StoreUnavailable,
    /// 503: too many store rounds.
    Contention,
}

impl Outcome {
    /// Stable snake_case name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stored => "stored",
            Self::NotStored => "not_stored",
            Self::NotRetained => "not_retained",
            Self::LeaseLost => "lease_lost",
            Self::CompletionFailed => "completion_failed",
            Self::NotCommitted => "not_committed",
            Self::HandlerFailed => "handler_failed",
            Self::Replayed => "replayed",
            Self::InFlight => "in_flight",
            Self::Mismatch => "mismatch",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::StoreUnavailable => "store_unavailable",
            Self::Contention => "contention",
        }
    }

    /// True when the handler ran in this flow.
    #[must_use]
    pub fn handler_ran(self) -> bool {
        matches!(
            self,
            Self::Stored
                | Self::NotStored
                | Self::NotRetained
                | Self::LeaseLost
                | Self::CompletionFailed
                | Self::NotCommitted
                | Self::HandlerFailed
        )
    }
}

/// What the host does next.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum Action {
    /// Execute this storage primitive and feed its result.
    Store(StoreOp),
    /// Run the handler now.
    RunHandler(RunHandler),
    /// Nothing to do; keep waiting for the handler.
    Wait,
    /// The lease was lost (another request took over): the host may cancel the handler; it still
    /// feeds the handler's end.
    LeaseLost,
    /// Send this response; the flow is finished.
    Respond {
        /// The response.
        response: HttpResponse,
        /// How the request ended.
        outcome: Outcome,
    },
    /// Re-raise the handler's error; the flow is finished.
    PropagateError {
        /// How the request ended (always [`Outcome::HandlerFailed`]).
        outcome: Outcome,
    },
}

/// First delay between cleanup attempts; doubled after each attempt up to
/// [`Cleanup::max_delay_ms`].
pub const CLEANUP_FIRST_DELAY_MS: u64 = 100;
/// Largest delay between cleanup attempts at any lease (at a lease shorter than 4 s the cap is
/// half the lease, see [`Cleanup::max_delay_ms`]).
pub const CLEANUP_MAX_DELAY_MS: u64 = 2_000;

/// Undoing a claim or takeover whose answer was lost (`spec/PROTOCOL.md` §7.4).
///
/// When the flow's claim or takeover ends in [`Event::StoreFailed`], the flow answers 503
/// `store-unavailable` and the handler never runs under its token. The statement may still have
/// been applied (the store received it and ran it later, e.g. a PostgreSQL server that was
/// stopped and resumed): the record would then hold the flow's token in progress until the lease
/// ends, answering 409 and then `outcome-unknown` for a handler that never ran. The cleanup's
/// [`op`](Cleanup::op) undoes that, fenced by the flow's token so it can never touch a record
/// anyone else owns:
///
/// - after a claim, [`StoreOp::Release`] (deletes the record only where it is in progress and
///   holds this token);
/// - after a takeover, [`StoreOp::Renew`] with `lease_ms` 0 (expires the lease at once and keeps
///   the record and its generation, as it was before the takeover, so the next request takes
///   over again with the same downstream key).
///
/// How hosts run it: in the background, after the response has been sent, never blocking the
/// request and never raising into it. Run [`op`](Cleanup::op), then feed its result (or
/// [`Event::StoreFailed`]) to [`next`](Cleanup::next) with the attempt number (0 first) and the
/// milliseconds elapsed since the first attempt started (host monotonic clock): it answers
/// [`CleanupStep::RetryAfter`] (sleep, then run the op again) or [`CleanupStep::Done`]. An
/// attempt that did not apply is retried too: the lost statement may be applied only later (it
/// can reach the store after the first cleanup attempt, e.g. once a frozen server resumes).
/// Attempts stop once the next one would start after [`budget_ms`](Cleanup::budget_ms): the
/// larger of the route's [`Config::cleanup_budget_ms`]
/// (default 30 s) and the lease, so the cleanup outlives a store that stays frozen for longer
/// than a short lease. The delay between attempts is capped at
/// [`max_delay_ms`](Cleanup::max_delay_ms) (at most half the lease), so a lost write that lands
/// while the cleanup still runs is undone before its lease ends and the record never reaches
/// `outcome-unknown` for a handler that never ran. Store errors during cleanup are logged at
/// most, never surfaced.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cleanup {
    op: StoreOp,
    budget_ms: u64,
    max_delay_ms: u64,
}

/// What a host does after a cleanup attempt (see [`Cleanup::next`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum CleanupStep {
    /// Wait this many milliseconds, then run [`Cleanup::op`] again.
    RetryAfter(u64),
    /// Stop: the cleanup applied, or the retry budget is spent.
    Done,
}

impl Cleanup {
    /// The token-fenced store operation to run (a [`StoreOp::Release`] or a
    /// [`StoreOp::Renew`] with `lease_ms` 0).
    #[must_use]
    pub fn op(&self) -> &StoreOp {
        &self.op
    }

    /// How long, in milliseconds from the first attempt, retries continue: the larger of the
    /// route's [`Config::cleanup_budget_ms`] and its
    /// lease.
    #[must_use]
    pub fn budget_ms(&self) -> u64 {
        self.budget_ms
    }

    /// The largest delay between two attempts: [`CLEANUP_MAX_DELAY_MS`], or half the lease when
    /// that is shorter (at least 1 ms).
    #[must_use]
    pub fn max_delay_ms(&self) -> u64 {
        self.max_delay_ms
    }

    /// The cleanup of a lost write of a flow under `config`: `op` with the route's budget and
    /// delay cap.
    fn new(op: StoreOp, config: &Config) -> Self {
        let lease_ms = config.lease.lease_ms();
        Self {
            op,
            budget_ms: lease_ms.max(config.cleanup_budget_ms.get()),
            max_delay_ms: CLEANUP_MAX_DELAY_MS.min((lease_ms / 2).max(1)),
        }
    }

    /// The step after attempt number `attempt` (0 for the first) ended with `result`
    /// ([`Event::Store`] with the op's result, or [`Event::StoreFailed`]), `elapsed_ms` after the
    /// first attempt started. Applied means done; anything else is retried with a doubling delay
    /// ([`CLEANUP_FIRST_DELAY_MS`] up to [`max_delay_ms`](Cleanup::max_delay_ms)) while the next
    /// attempt would start within [`budget_ms`](Cleanup::budget_ms).
    pub fn next(&self, attempt: u32, elapsed_ms: u64, result: &Event) -> CleanupStep {
        let applied = matches!(
            result,
            Event::Store(StoreResult::Released(true) | StoreResult::Renewed(true))
        );
        if applied {
            return CleanupStep::Done;
        }
        let delay = CLEANUP_FIRST_DELAY_MS
            .checked_shl(attempt.min(32))
            .unwrap_or(self.max_delay_ms)
            .min(self.max_delay_ms);
        if elapsed_ms.saturating_add(delay) <= self.budget_ms {
            CleanupStep::RetryAfter(delay)
        } else {
            CleanupStep::Done
        }
    }
}

/// A host fed an event the flow cannot accept in its current phase (a binding bug).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FlowError {
    /// The event does not fit the phase; the flow is unchanged.
    #[error("event {event} is not valid while the flow is {phase}")]
    UnexpectedEvent {
        /// The flow's phase.
        phase: &'static str,
        /// The event fed.
        event: &'static str,
    },
    /// The flow already answered.
    #[error("the flow is finished")]
    Finished,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Finish {
    Respond(HttpResponse, Outcome),
    Propagate,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    Claiming,
    Reading,
    TakingOver,
    MarkingUnknown,
    Running {
        renewing: bool,
        lease_lost: bool,
    },
    /// Completing; the outcome once it applied (`Stored`, or `NotRetained` for the problem).
    Completing(HttpResponse, Outcome),
    Releasing(Finish),
    Expiring(Finish),
    Abandoning(Finish),
    /// Transactional mode: committing; `ok` once committed, `failed` on a store failure.
    Committing {
        ok: Finish,
        failed: Finish,
    },
    Finished,
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Self::Claiming => "claiming",
            Self::Reading => "reading",
            Self::TakingOver => "taking_over",
            Self::MarkingUnknown => "marking_unknown",
            Self::Running { renewing: true, .. } => "running_renewing",
            Self::Running { .. } => "running",
            Self::Completing(..) => "completing",
            Self::Releasing(_) => "releasing",
            Self::Expiring(_) => "expiring",
            Self::Abandoning(_) => "abandoning",
            Self::Committing { .. } => "committing",
            Self::Finished => "finished",
        }
    }
}

fn event_name(e: &Event) -> &'static str {
    match e {
        Event::Store(StoreResult::Claimed { .. }) => "claimed",
        Event::Store(StoreResult::Existing { .. }) => "existing",
        Event::Store(StoreResult::Got { .. }) => "got",
        Event::Store(StoreResult::TookOver(_)) => "took_over",
        Event::Store(StoreResult::MarkedUnknown(_)) => "marked_unknown",
        Event::Store(StoreResult::Completed(_)) => "completed",
        Event::Store(StoreResult::Released(_)) => "released",
        Event::Store(StoreResult::Renewed(_)) => "renewed",
        Event::Store(StoreResult::Committed) => "committed",
        Event::Store(StoreResult::Locked { .. }) => "locked",
        Event::StoreFailed => "store_failed",
        Event::HandlerFinished(_) => "handler_finished",
        Event::HandlerFailed { .. } => "handler_failed",
        Event::HeartbeatDue => "heartbeat_due",
    }
}

/// The server flow for one request with a valid key (see the module docs).
#[derive(Clone, Debug)]
pub struct ServerFlow {
    scope: ScopeId,
    fingerprint: FingerprintText,
    config: Arc<Config>,
    token: FencingToken,
    generation: Option<u32>,
    reads: u8,
    phase: Phase,
    cleanup: Option<Cleanup>,
}

impl ServerFlow {
    /// Starts the flow: the first action is always [`StoreOp::Claim`].
    ///
    /// `entropy` must be 16 fresh random bytes from the host (the fencing token).
    pub fn start(
        scope: ScopeId,
        fingerprint: FingerprintText,
        config: Arc<Config>,
        entropy: [u8; 16],
    ) -> (Self, Action) {
        let mut flow = Self {
            scope,
            fingerprint,
            config,
            token: FencingToken(entropy),
            generation: None,
            reads: 0,
            phase: Phase::Claiming,
            cleanup: None,
        };
        let first = flow.claim();
        (flow, first)
    }

    /// This flow's fencing token.
    #[must_use]
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The generation this flow owns, once it has claimed or taken over the record.
    #[must_use]
    pub fn generation(&self) -> Option<u32> {
        self.generation
    }

    /// True once the flow has answered.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }

    /// The background cleanup the host runs after answering, if any (see [`Cleanup`]).
    ///
    /// `Some` only once the flow has finished with [`Outcome::StoreUnavailable`] because its claim
    /// or takeover ended in [`Event::StoreFailed`], and never in transactional mode (closing the
    /// failed transaction rolls the claim back). `None` otherwise: every other path either
    /// wrote nothing with this flow's token or settled the record itself.
    #[must_use]
    pub fn cleanup(&self) -> Option<&Cleanup> {
        self.cleanup.as_ref()
    }

    /// Feeds one event and returns the next action. A rejected event leaves the flow unchanged.
    pub fn handle(&mut self, event: Event) -> Result<Action, FlowError> {
        let phase = std::mem::replace(&mut self.phase, Phase::Finished);
        match (phase, event) {
            (Phase::Finished, _) => Err(FlowError::Finished),

            // Admission: claim, read, takeover, mark-unknown.
            (Phase::Claiming, Event::Store(StoreResult::Claimed { generation, .. }))
            | (Phase::TakingOver, Event::Store(StoreResult::TookOver(Some(generation)))) => {
                Ok(self.run(generation))
            }
            (Phase::Claiming, Event::Store(StoreResult::Existing { record, now_ms }))
            | (
                Phase::Reading,
                Event::Store(StoreResult::Got {
                    record: Some(record),
                    now_ms,
                }),
            ) => Ok(self.on_record(record, now_ms)),
            (Phase::Reading, Event::Store(StoreResult::Got { record: None, .. })) => {
                Ok(self.claim())
            }
            (Phase::Claiming | Phase::Reading, Event::Store(StoreResult::Locked { .. })) => {
                // Another request's uncommitted claim holds the row: it is in flight. Nothing
                // was written, so there is nothing to clean up.
                Ok(self.problem(
                    ProblemKind::InFlight,
                    Some(self.config.in_flight_retry_after_ms.get()),
                    Outcome::InFlight,
                ))
            }
            (Phase::TakingOver, Event::Store(StoreResult::TookOver(None)))
            | (Phase::MarkingUnknown, Event::Store(StoreResult::MarkedUnknown(false))) => {
                Ok(self.get())
            }
            (Phase::MarkingUnknown, Event::Store(StoreResult::MarkedUnknown(true))) => {
                let fin = Self::problem_finish(
                    ProblemKind::OutcomeUnknown,
                    None,
                    Outcome::OutcomeUnknown,
                );
                Ok(if self.config.transactional {
                    // The mark was written in the transaction: keep it. The answer is the same
                    // whether or not the commit succeeds (a later request marks again).
                    self.commit(fin.clone(), fin)
                } else {
                    self.finish(fin)
                })
            }
            (
                phase @ (Phase::Claiming
                | Phase::Reading
                | Phase::TakingOver
                | Phase::MarkingUnknown),
                Event::StoreFailed,
            ) => {
                self.cleanup = self.lost_write_cleanup(&phase);
                Ok(self.problem(
                    ProblemKind::StoreUnavailable,
                    Some(self.config.unavailable_retry_after_ms.get()),
                    Outcome::StoreUnavailable,
                ))
            }

            // The handler runs.
            (
                Phase::Running {
                    renewing: false,
                    lease_lost,
                },
                Event::HeartbeatDue,
            ) if !self.config.transactional => {
                if lease_lost {
                    self.phase = Phase::Running {
                        renewing: false,
                        lease_lost,
                    };
                    Ok(Action::Wait)
                } else {
                    self.phase = Phase::Running {
                        renewing: true,
                        lease_lost,
                    };
                    Ok(Action::Store(StoreOp::Renew {
                        scope: self.scope,
                        token: self.token,
                        lease_ms: self.config.lease.lease_ms(),
                    }))
                }
            }
            (Phase::Running { renewing: true, .. }, Event::Store(StoreResult::Renewed(ok))) => {
                self.phase = Phase::Running {
                    renewing: false,
                    lease_lost: !ok,
                };
                Ok(if ok { Action::Wait } else { Action::LeaseLost })
            }
            (
                Phase::Running {
                    renewing: true,
                    lease_lost,
                },
                Event::StoreFailed,
            ) => {
                self.phase = Phase::Running {
                    renewing: false,
                    lease_lost,
                };
                Ok(Action::Wait)
            }
            (
                Phase::Running {
                    renewing: false,
                    lease_lost,
                },
                Event::HandlerFinished(response),
            ) => Ok(self.on_finished(response, lease_lost)),
            (
                Phase::Running {
                    renewing: false,
                    lease_lost,
                },
                Event::HandlerFailed { maybe_side_effect },
            ) => Ok(if lease_lost {
                self.finish(Finish::Propagate)
            } else if self.config.transactional {
                // Its writes roll back with the claim: whatever it did, nothing happened.
                self.release(Finish::Propagate)
            } else if maybe_side_effect {
                self.abandon(Finish::Propagate)
            } else {
                self.release(Finish::Propagate)
            }),

            // After the handler, transactional mode.
            (Phase::Completing(response, outcome), Event::Store(StoreResult::Completed(true)))
                if self.config.transactional =>
            {
                let failed = self.not_committed();
                Ok(self.commit(Finish::Respond(response, outcome), failed))
            }
            (Phase::Completing(..), Event::Store(StoreResult::Completed(false)))
                if self.config.transactional =>
            {
                // The record is not ours: roll back, never commit the handler's writes.
                let fin = self.not_committed();
                Ok(self.release(fin))
            }
            (Phase::Completing(..), Event::StoreFailed) if self.config.transactional => {
                let fin = self.not_committed();
                Ok(self.finish(fin))
            }
            (Phase::Releasing(_), Event::StoreFailed) if self.config.transactional => {
                // The rollback after the handler failed (e.g. the server went away during the
                // handler's own SQL): nothing committed, so the answer is the store's 503 with
                // Retry-After, never the handler's error or its uncommitted response (§7.6).
                let fin = self.not_committed();
                Ok(self.finish(fin))
            }
            (Phase::Committing { ok, .. }, Event::Store(StoreResult::Committed)) => {
                Ok(self.finish(ok))
            }
            (Phase::Committing { failed, .. }, Event::StoreFailed) => Ok(self.finish(failed)),

            // After the handler.
            (Phase::Completing(response, outcome), Event::Store(StoreResult::Completed(ok))) => {
                let outcome = if ok { outcome } else { Outcome::LeaseLost };
                Ok(self.finish(Finish::Respond(response, outcome)))
            }
            (Phase::Completing(response, _), Event::StoreFailed) => {
                Ok(self.finish(Finish::Respond(response, Outcome::CompletionFailed)))
            }
            (
                Phase::Releasing(fin),
                Event::Store(StoreResult::Released(_)) | Event::StoreFailed,
            )
            | (
                Phase::Expiring(fin),
                Event::Store(StoreResult::Renewed(false)) | Event::StoreFailed,
            )
            | (
                Phase::Abandoning(fin),
                Event::Store(StoreResult::MarkedUnknown(_)) | Event::StoreFailed,
            ) => Ok(self.finish(fin)),
            (Phase::Expiring(fin), Event::Store(StoreResult::Renewed(true))) => {
                match self.config.takeover {
                    TakeoverPolicy::OutcomeUnknown => {
                        self.phase = Phase::Abandoning(fin);
                        Ok(self.mark_own_unknown())
                    }
                    TakeoverPolicy::ReRun => Ok(self.finish(fin)),
                }
            }

            (phase, event) => {
                let err = FlowError::UnexpectedEvent {
                    phase: phase.name(),
                    event: event_name(&event),
                };
                self.phase = phase;
                Err(err)
            }
        }
    }

    fn claim(&mut self) -> Action {
        if self.reads >= self.config.max_store_rounds.get() {
            return self.contention();
        }
        self.reads += 1;
        self.phase = Phase::Claiming;
        Action::Store(StoreOp::Claim {
            scope: self.scope,
            fingerprint: self.fingerprint.clone(),
            token: self.token,
            lease_ms: self.config.lease.lease_ms(),
            ttl_ms: self.config.ttl_ms.get(),
        })
    }

    /// The cleanup for a store failure in `phase`: only a claim or a takeover writes this
    /// flow's token, and only outside a transaction can it outlive the flow.
    fn lost_write_cleanup(&self, phase: &Phase) -> Option<Cleanup> {
        if self.config.transactional {
            return None;
        }
        let op = match phase {
            Phase::Claiming => StoreOp::Release {
                scope: self.scope,
                token: self.token,
            },
            Phase::TakingOver => StoreOp::Renew {
                scope: self.scope,
                token: self.token,
                lease_ms: 0,
            },
            _ => return None,
        };
        Some(Cleanup::new(op, &self.config))
    }

    fn get(&mut self) -> Action {
        if self.reads >= self.config.max_store_rounds.get() {
            return self.contention();
        }
        self.reads += 1;
        self.phase = Phase::Reading;
        Action::Store(StoreOp::Get { scope: self.scope })
    }

    fn contention(&mut self) -> Action {
        self.problem(
            ProblemKind::Contention,
            Some(self.config.unavailable_retry_after_ms.get()),
            Outcome::Contention,
        )
    }

    fn problem(
        &mut self,
        kind: ProblemKind,
        retry_after_ms: Option<u64>,
        outcome: Outcome,
    ) -> Action {
        self.finish(Self::problem_finish(kind, retry_after_ms, outcome))
    }

    fn problem_finish(kind: ProblemKind, retry_after_ms: Option<u64>, outcome: Outcome) -> Finish {
        Finish::Respond(problem_response(kind, None, None, retry_after_ms), outcome)
    }

    /// Transactional mode: the 503 answered when the handler's transaction did not commit.
    fn not_committed(&self) -> Finish {
        Finish::Respond(
            problem_response(
                ProblemKind::StoreUnavailable,
                Some(NOT_COMMITTED_DETAIL),
                None,
                Some(self.config.unavailable_retry_after_ms.get()),
            ),
            Outcome::NotCommitted,
        )
    }

    /// Transactional mode: `COMMIT`, then `ok`, or `failed` on a store failure.
    fn commit(&mut self, ok: Finish, failed: Finish) -> Action {
        self.phase = Phase::Committing { ok, failed };
        Action::Store(StoreOp::Commit { scope: self.scope })
    }

    /// Marks the own (expired) record outcome-unknown.
    fn mark_own_unknown(&self) -> Action {
        Action::Store(StoreOp::MarkUnknown {
            scope: self.scope,
            seen_token: self.token,
            ttl_ms: self.config.ttl_ms.get(),
        })
    }

    fn finish(&mut self, fin: Finish) -> Action {
        self.phase = Phase::Finished;
        match fin {
            Finish::Respond(response, outcome) => Action::Respond { response, outcome },
            Finish::Propagate => Action::PropagateError {
                outcome: Outcome::HandlerFailed,
            },
        }
    }

    fn run(&mut self, generation: u32) -> Action {
        self.generation = Some(generation);
        self.phase = Phase::Running {
            renewing: false,
            lease_lost: false,
        };
        Action::RunHandler(RunHandler {
            token: self.token,
            generation,
            downstream_key: downstream_key(&self.scope, &self.fingerprint, generation),
            // An uncommitted claim is invisible to other requests: no lease to keep alive.
            heartbeat_ms: if self.config.transactional {
                None
            } else {
                self.config.lease.heartbeat_ms()
            },
        })
    }

    fn on_record(&mut self, record: Record, now_ms: u64) -> Action {
        match decide(&record, &self.fingerprint, now_ms, &self.config) {
            Decision::Absent => self.claim(),
            Decision::Replay(_) => match record.state {
                RecordState::Completed { response } => {
                    self.finish(Finish::Respond(replay_owned(response), Outcome::Replayed))
                }
                // decide only answers Replay for a completed record
                _ => self.problem(ProblemKind::OutcomeUnknown, None, Outcome::OutcomeUnknown),
            },
            Decision::InFlight { retry_after_ms } => self.problem(
                ProblemKind::InFlight,
                Some(retry_after_ms),
                Outcome::InFlight,
            ),
            Decision::Mismatch => self.problem(ProblemKind::Mismatch, None, Outcome::Mismatch),
            Decision::OutcomeUnknown => {
                self.problem(ProblemKind::OutcomeUnknown, None, Outcome::OutcomeUnknown)
            }
            Decision::TakeOver { seen_token } => {
                self.phase = Phase::TakingOver;
                Action::Store(StoreOp::TakeOver {
                    scope: self.scope,
                    seen_token,
                    new_token: self.token,
                    lease_ms: self.config.lease.lease_ms(),
                })
            }
            Decision::MarkUnknown { seen_token } => {
                self.phase = Phase::MarkingUnknown;
                Action::Store(StoreOp::MarkUnknown {
                    scope: self.scope,
                    seen_token,
                    ttl_ms: self.config.ttl_ms.get(),
                })
            }
        }
    }

    fn on_finished(&mut self, response: HandlerResponse, lease_lost: bool) -> Action {
        if lease_lost {
            return self.finish(Finish::Respond(response.into_http(), Outcome::LeaseLost));
        }
        let policy = &self.config.response;
        let stored_len = response
            .body_to_store
            .as_ref()
            .map_or(response.body.len(), Vec::len);
        let verdict = if response.body_truncated && policy.stores(response.status, response.origin)
        {
            StoreVerdict::TooLarge
        } else {
            policy.verdict_from(response.status, response.origin, stored_len)
        };
        let encoded = match verdict {
            StoreVerdict::Release => {
                return self.release(Finish::Respond(response.into_http(), Outcome::NotStored));
            }
            StoreVerdict::TooLarge => None,
            StoreVerdict::Store => StoredResponse {
                status: response.status,
                headers: response
                    .headers
                    .iter()
                    .filter(|(n, _)| policy.stores_header(n))
                    .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
                    .collect(),
                body: response
                    .body_to_store
                    .clone()
                    .unwrap_or_else(|| response.body.clone()),
            }
            .encode()
            .ok(),
        };
        let (bytes, outcome) = match encoded {
            Some(bytes) => (bytes, Outcome::Stored),
            // Too large or not encodable: the request ran and its client gets the response;
            // retries replay the response-not-retained problem (§7.5).
            None => match not_retained_response().encode() {
                Ok(bytes) => (bytes, Outcome::NotRetained),
                // The problem record always encodes; if it ever did not, fall back to the
                // takeover policy rather than leave the key in flight.
                Err(_) if self.config.transactional => {
                    let fin = self.not_committed();
                    return self.release(fin);
                }
                Err(_) => {
                    return self
                        .abandon(Finish::Respond(response.into_http(), Outcome::NotRetained));
                }
            },
        };
        self.phase = Phase::Completing(response.into_http(), outcome);
        Action::Store(StoreOp::Complete {
            scope: self.scope,
            token: self.token,
            response: bytes,
            ttl_ms: self.config.ttl_ms.get(),
        })
    }

    fn release(&mut self, fin: Finish) -> Action {
        self.phase = Phase::Releasing(fin);
        Action::Store(StoreOp::Release {
            scope: self.scope,
            token: self.token,
        })
    }

    /// Hands an execution whose outcome cannot be recorded to the takeover policy: expire the own
    /// lease at once (renew with 0 ms), then, under the outcome-unknown policy, mark the record.
    fn abandon(&mut self, fin: Finish) -> Action {
        self.phase = Phase::Expiring(fin);
        Action::Store(StoreOp::Renew {
            scope: self.scope,
            token: self.token,
            lease_ms: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    //! Exhaustive exploration of the flow's event tree (every store answer, failure and handler
    //! end, for both takeover policies) checking the transactional-mode guarantees of
    //! `spec/PROTOCOL.md` §7.6 at every leaf.
    use super::*;
    use crate::policy::{HeaderAllowlist, Redaction, ResponsePolicy};

    const MINE: FencingToken = FencingToken([7; 16]);
    const OTHER: FencingToken = FencingToken([9; 16]);
    const NOW: u64 = 1_000_000;

    fn fp(c: char) -> FingerprintText {
        FingerprintText::new(format!("v1:{}", c.to_string().repeat(64))).expect("valid")
    }

    fn config(transactional: bool, takeover: TakeoverPolicy) -> Arc<Config> {
        let response = ResponsePolicy::new(
            &[429],
            false,
            8,
            HeaderAllowlist::default(),
            Redaction::None,
        )
        .expect("valid policy");
        Arc::new(Config {
            takeover,
            response,
            transactional,
            ..Config::default()
        })
    }

    fn records() -> Vec<Record> {
        let base = Record {
            fingerprint: fp('a'),
            generation: 2,
            token: OTHER,
            expires_at_ms: NOW + 50_000,
            state: RecordState::InProgress {
                lease_until_ms: NOW - 1,
            },
        };
        let live = Record {
            state: RecordState::InProgress {
                lease_until_ms: NOW + 5,
            },
            ..base.clone()
        };
        let done = Record {
            state: RecordState::Completed {
                response: StoredResponse {
                    status: 201,
                    headers: vec![],
                    body: b"ok".to_vec(),
                },
            },
            ..base.clone()
        };
        let unknown = Record {
            state: RecordState::OutcomeUnknown,
            ..base.clone()
        };
        let other = Record {
            fingerprint: fp('b'),
            ..base.clone()
        };
        let expired = Record {
            expires_at_ms: NOW,
            ..base.clone()
        };
        vec![base, live, done, unknown, other, expired]
    }

    fn handler(status: u16, body: &[u8]) -> Event {
        Event::HandlerFinished(HandlerResponse::new(status, vec![], body.to_vec()))
    }

    /// The events a host may feed after `action`.
    fn answers(action: &Action) -> Vec<Event> {
        let store = |results: Vec<StoreResult>| {
            let mut out: Vec<Event> = results.into_iter().map(Event::Store).collect();
            out.push(Event::StoreFailed);
            out
        };
        match action {
            Action::Store(StoreOp::Claim { .. }) => {
                let mut r = vec![StoreResult::Claimed {
                    generation: 1,
                    now_ms: NOW,
                }];
                r.extend(records().into_iter().map(|record| StoreResult::Existing {
                    record,
                    now_ms: NOW,
                }));
                r.push(StoreResult::Locked { now_ms: NOW });
                store(r)
            }
            Action::Store(StoreOp::Get { .. }) => {
                let mut r = vec![StoreResult::Got {
                    record: None,
                    now_ms: NOW,
                }];
                r.extend(records().into_iter().map(|record| StoreResult::Got {
                    record: Some(record),
                    now_ms: NOW,
                }));
                r.push(StoreResult::Locked { now_ms: NOW });
                store(r)
            }
            Action::Store(StoreOp::TakeOver { .. }) => store(vec![
                StoreResult::TookOver(Some(2)),
                StoreResult::TookOver(None),
            ]),
            Action::Store(StoreOp::MarkUnknown { .. }) => store(vec![
                StoreResult::MarkedUnknown(true),
                StoreResult::MarkedUnknown(false),
            ]),
            Action::Store(StoreOp::Complete { .. }) => store(vec![
                StoreResult::Completed(true),
                StoreResult::Completed(false),
            ]),
            Action::Store(StoreOp::Release { .. }) => store(vec![
                StoreResult::Released(true),
                StoreResult::Released(false),
            ]),
            Action::Store(StoreOp::Renew { .. }) => store(vec![
                StoreResult::Renewed(true),
                StoreResult::Renewed(false),
            ]),
            Action::Store(StoreOp::Commit { .. }) => store(vec![StoreResult::Committed]),
            Action::RunHandler(_) | Action::Wait | Action::LeaseLost => vec![
                Event::HeartbeatDue,
                handler(201, b"small"),
                handler(201, b"far too large"),
                handler(500, b"boom"),
                Event::HandlerFinished(HandlerResponse {
                    body_truncated: true,
                    ..HandlerResponse::new(201, vec![], b"far".to_vec())
                }),
                Event::HandlerFinished(HandlerResponse {
                    origin: ResponseOrigin::Framework,
                    ..HandlerResponse::new(422, vec![], b"{}".to_vec())
                }),
                Event::HandlerFailed {
                    maybe_side_effect: true,
                },
                Event::HandlerFailed {
                    maybe_side_effect: false,
                },
            ],
            Action::Respond { .. } | Action::PropagateError { .. } => vec![],
        }
    }

    /// One path: the actions returned and the events fed, in order.
    #[derive(Clone, Default)]
    struct Trace {
        steps: Vec<(Event, Action)>,
        ran: bool,
    }

    impl Trace {
        fn last_op(&self) -> Option<&StoreOp> {
            self.steps.iter().rev().find_map(|(_, a)| match a {
                Action::Store(op) => Some(op),
                _ => None,
            })
        }
    }

    fn is_503_not_committed(response: &HttpResponse, outcome: Outcome) -> bool {
        outcome == Outcome::NotCommitted
            && response.status == 503
            && response
                .headers
                .iter()
                .any(|(n, v)| n == "retry-after" && v == "1")
    }

    /// Checks a finished transactional path.
    fn check_tx_leaf(first: &Action, t: &Trace, end: &Action) {
        let (last_event, _) = t.steps.last().expect("a leaf follows an event");
        let before_end = t.steps[..t.steps.len() - 1]
            .last()
            .map_or(first, |(_, a)| a);
        match end {
            Action::Respond { response, outcome } if t.ran => match outcome {
                Outcome::Stored | Outcome::NotRetained => {
                    assert_eq!(last_event, &Event::Store(StoreResult::Committed));
                    assert!(matches!(before_end, Action::Store(StoreOp::Commit { .. })));
                    assert_ne!(response.status, 503);
                }
                Outcome::NotStored => {
                    assert!(matches!(t.last_op(), Some(StoreOp::Release { .. })));
                    // The only not-stored answers fed: a 500, and a framework's 422.
                    assert!(matches!(response.status, 500 | 422), "{}", response.status);
                }
                _ => assert!(is_503_not_committed(response, *outcome), "{outcome:?}"),
            },
            Action::PropagateError { .. } => {
                assert!(matches!(t.last_op(), Some(StoreOp::Release { .. })));
            }
            Action::Respond { outcome, .. } => assert!(!outcome.handler_ran()),
            other => panic!("not a leaf: {other:?}"),
        }
        // A commit only follows a write that applied.
        let mut prev: Option<&Event> = None;
        for (event, action) in &t.steps {
            if matches!(action, Action::Store(StoreOp::Commit { .. })) {
                assert!(
                    matches!(
                        event,
                        Event::Store(
                            StoreResult::Completed(true) | StoreResult::MarkedUnknown(true)
                        )
                    ),
                    "commit after {event:?} (before: {prev:?})"
                );
            }
            prev = Some(event);
        }
    }

    /// Checks the cleanup of a finished path: present exactly when the last store op was a claim
    /// or takeover that failed outside a transaction, and then a token-fenced undo of it.
    fn check_cleanup_leaf(flow: &ServerFlow, last: &Action, t: &Trace, end: &Action) {
        let (last_event, _) = t.steps.last().expect("a leaf follows an event");
        let failed = *last_event == Event::StoreFailed;
        let expected = match last {
            Action::Store(StoreOp::Claim { scope, token, .. })
                if failed && !flow.config.transactional =>
            {
                Some(StoreOp::Release {
                    scope: *scope,
                    token: *token,
                })
            }
            Action::Store(StoreOp::TakeOver {
                scope, new_token, ..
            }) if failed && !flow.config.transactional => Some(StoreOp::Renew {
                scope: *scope,
                token: *new_token,
                lease_ms: 0,
            }),
            _ => None,
        };
        assert_eq!(flow.cleanup().map(Cleanup::op), expected.as_ref());
        if let Some(cleanup) = flow.cleanup() {
            let lease = flow.config.lease.lease_ms();
            assert_eq!(
                cleanup.budget_ms(),
                lease.max(flow.config.cleanup_budget_ms.get())
            );
            assert_eq!(cleanup.max_delay_ms(), CLEANUP_MAX_DELAY_MS.min(lease / 2));
            assert!(matches!(
                end,
                Action::Respond {
                    outcome: Outcome::StoreUnavailable,
                    response,
                } if response.status == 503
            ));
            assert!(!t.ran, "a cleanup never follows a handler run");
        }
    }

    #[test]
    fn cleanup_retries_with_a_doubling_capped_delay_within_the_budget() {
        let (mut flow, _) = ServerFlow::start(
            ScopeId::from_bytes([3; 32]),
            fp('a'),
            config(false, TakeoverPolicy::OutcomeUnknown),
            MINE.0,
        );
        assert_eq!(flow.cleanup(), None);
        let end = flow.handle(Event::StoreFailed).expect("accepted");
        assert!(matches!(
            end,
            Action::Respond {
                outcome: Outcome::StoreUnavailable,
                ..
            }
        ));
        let cleanup = flow
            .cleanup()
            .expect("a failed claim leaves a cleanup")
            .clone();
        let budget = cleanup.budget_ms();
        assert_eq!(budget, 30_000);
        let applied = Event::Store(StoreResult::Released(true));
        let missed = Event::Store(StoreResult::Released(false));
        assert_eq!(cleanup.next(0, 0, &applied), CleanupStep::Done);
        assert_eq!(
            cleanup.next(0, 0, &Event::StoreFailed),
            CleanupStep::RetryAfter(100)
        );
        assert_eq!(cleanup.next(1, 150, &missed), CleanupStep::RetryAfter(200));
        assert_eq!(
            cleanup.next(4, 2_000, &missed),
            CleanupStep::RetryAfter(1_600)
        );
        assert_eq!(
            cleanup.next(5, 4_000, &missed),
            CleanupStep::RetryAfter(2_000)
        );
        assert_eq!(
            cleanup.next(u32::MAX, 4_000, &Event::StoreFailed),
            CleanupStep::RetryAfter(2_000)
        );
        assert_eq!(
            cleanup.next(20, budget - 2_000, &missed),
            CleanupStep::RetryAfter(2_000)
        );
        assert_eq!(cleanup.next(20, budget - 1_999, &missed), CleanupStep::Done);
        assert_eq!(cleanup.next(20, u64::MAX, &missed), CleanupStep::Done);
        // Whatever the answers, the attempts are bounded by the budget.
        let (mut attempt, mut elapsed) = (0_u32, 0_u64);
        while let CleanupStep::RetryAfter(delay) = cleanup.next(attempt, elapsed, &missed) {
            elapsed += delay;
            attempt += 1;
        }
        assert!(elapsed <= budget);
        assert_eq!(attempt, 18);
        // A finished flow keeps its cleanup; events after the end change nothing.
        assert_eq!(flow.handle(Event::StoreFailed), Err(FlowError::Finished));
        assert_eq!(flow.cleanup(), Some(&cleanup));
    }

    /// The cleanup left by a claim that failed under a route with this lease and cleanup budget.
    fn lost_claim_cleanup(lease_ms: u64, cleanup_budget_ms: u64) -> Cleanup {
        let config = Arc::new(Config {
            lease: crate::policy::LeasePolicy::new(lease_ms, None).expect("valid lease"),
            cleanup_budget_ms: std::num::NonZeroU64::new(cleanup_budget_ms).expect("positive"),
            ..Config::default()
        });
        let (mut flow, _) =
            ServerFlow::start(ScopeId::from_bytes([4; 32]), fp('a'), config, MINE.0);
        let end = flow.handle(Event::StoreFailed).expect("accepted");
        assert!(matches!(
            end,
            Action::Respond {
                outcome: Outcome::StoreUnavailable,
                ..
            }
        ));
        flow.cleanup()
            .expect("a failed claim leaves a cleanup")
            .clone()
    }

    /// The attempt start times (ms after the first) of a cleanup whose every attempt misses.
    fn attempt_times(cleanup: &Cleanup) -> Vec<u64> {
        let missed = Event::Store(StoreResult::Released(false));
        let (mut attempt, mut elapsed, mut times) = (0_u32, 0_u64, vec![0_u64]);
        while let CleanupStep::RetryAfter(delay) = cleanup.next(attempt, elapsed, &missed) {
            elapsed += delay;
            attempt += 1;
            times.push(elapsed);
        }
        times
    }

    #[test]
    fn cleanup_budget_is_the_route_setting_or_the_lease_whichever_is_longer() {
        let default_budget = crate::policy::DEFAULT_CLEANUP_BUDGET_MS;
        assert_eq!(Config::default().cleanup_budget_ms.get(), default_budget);
        // A short lease keeps the default budget: a store frozen for longer than the lease can
        // still apply the lost claim while the cleanup runs.
        assert_eq!(
            lost_claim_cleanup(1_000, default_budget).budget_ms(),
            30_000
        );
        assert_eq!(lost_claim_cleanup(1_000, 3_000).budget_ms(), 3_000);
        // A lease longer than the setting extends the budget to the lease.
        assert_eq!(lost_claim_cleanup(60_000, 5_000).budget_ms(), 60_000);
        assert_eq!(lost_claim_cleanup(30_000, 1).budget_ms(), 30_000);
        // The attempts stop within the budget, and the last starts less than a delay before it.
        for (lease, budget) in [(1_000, 30_000), (1_000, 3_000), (5_000, 12_345)] {
            let cleanup = lost_claim_cleanup(lease, budget);
            let times = attempt_times(&cleanup);
            let last = *times.last().expect("one attempt at least");
            assert!(last <= budget, "lease {lease} budget {budget}: {last}");
            assert!(
                last + cleanup.max_delay_ms() > budget,
                "lease {lease} budget {budget}: stopped early at {last}"
            );
        }
        // Same rule for the cleanup after a lost takeover.
        let config = Arc::new(Config {
            lease: crate::policy::LeasePolicy::new(1_000, None).expect("valid lease"),
            takeover: TakeoverPolicy::ReRun,
            ..Config::default()
        });
        let (mut flow, _) =
            ServerFlow::start(ScopeId::from_bytes([5; 32]), fp('a'), config, MINE.0);
        let expired = Record {
            fingerprint: fp('a'),
            generation: 1,
            token: OTHER,
            expires_at_ms: NOW + 50_000,
            state: RecordState::InProgress {
                lease_until_ms: NOW - 1,
            },
        };
        let action = flow
            .handle(Event::Store(StoreResult::Existing {
                record: expired,
                now_ms: NOW,
            }))
            .expect("accepted");
        assert!(matches!(action, Action::Store(StoreOp::TakeOver { .. })));
        let _ = flow.handle(Event::StoreFailed).expect("accepted");
        let cleanup = flow.cleanup().expect("a failed takeover leaves a cleanup");
        assert!(matches!(cleanup.op(), StoreOp::Renew { lease_ms: 0, .. }));
        assert_eq!(cleanup.budget_ms(), 30_000);
        assert_eq!(cleanup.max_delay_ms(), 500);
    }

    #[test]
    fn cleanup_delay_is_capped_at_half_a_short_lease() {
        for (lease, cap) in [
            (1_000, 500),
            (1_001, 500),
            (3_000, 1_500),
            (4_000, 2_000),
            (30_000, 2_000),
            (86_400_000, 2_000),
        ] {
            let cleanup = lost_claim_cleanup(lease, 30_000);
            assert_eq!(cleanup.max_delay_ms(), cap, "lease {lease}");
            assert!(cap <= CLEANUP_MAX_DELAY_MS);
        }
        let cleanup = lost_claim_cleanup(1_000, 30_000);
        let missed = Event::Store(StoreResult::Released(false));
        let delays: Vec<_> = (0..6)
            .map(|attempt| cleanup.next(attempt, 0, &missed))
            .collect();
        assert_eq!(
            delays,
            [100, 200, 400, 500, 500, 500].map(CleanupStep::RetryAfter)
        );
        assert_eq!(
            cleanup.next(u32::MAX, 0, &Event::StoreFailed),
            CleanupStep::RetryAfter(500)
        );
        // A lost claim that lands at any moment t within the budget holds its lease until
        // t + lease; some attempt starts in (t, t + lease / 2], so it is released before its
        // lease ends (never outcome-unknown without a run).
        let times = attempt_times(&cleanup);
        assert!(times.windows(2).all(|w| w[1] - w[0] <= 500), "{times:?}");
        for t in 0..30_000 - 500 {
            assert!(
                times.iter().any(|&a| a > t && a <= t + 500),
                "claim landing at {t} ms is not released before its lease ends"
            );
        }
    }

    /// Depth-first over every path; returns the number of leaves.
    fn explore(flow: &ServerFlow, first: &Action, action: &Action, trace: &Trace) -> usize {
        let transactional = flow.config.transactional;
        if let Action::RunHandler(run) = action {
            assert_eq!(run.heartbeat_ms.is_none(), transactional);
        }
        if !transactional {
            assert!(!matches!(action, Action::Store(StoreOp::Commit { .. })));
        }
        let mut leaves = 0;
        let beats = trace
            .steps
            .iter()
            .filter(|(e, _)| *e == Event::HeartbeatDue)
            .count();
        for event in answers(action) {
            if event == Event::HeartbeatDue && beats >= 2 {
                // Heartbeats repeat forever in the non-transactional flow; two show the cycle.
                continue;
            }
            let mut next = flow.clone();
            let Ok(got) = next.handle(event.clone()) else {
                // Refused: only a heartbeat, and only in transactional mode.
                assert_eq!(event, Event::HeartbeatDue);
                assert!(transactional);
                continue;
            };
            let mut t = trace.clone();
            t.ran |= matches!(action, Action::RunHandler(_));
            t.steps.push((event, got.clone()));
            if next.is_finished() {
                if transactional {
                    check_tx_leaf(first, &t, &got);
                }
                check_cleanup_leaf(&next, action, &t, &got);
                leaves += 1;
            } else {
                leaves += explore(&next, first, &got, &t);
            }
        }
        leaves
    }

    #[test]
    fn every_transactional_path_keeps_the_commit_rules() {
        for transactional in [true, false] {
            for takeover in [TakeoverPolicy::ReRun, TakeoverPolicy::OutcomeUnknown] {
                let (flow, first) = ServerFlow::start(
                    ScopeId::from_bytes([3; 32]),
                    fp('a'),
                    config(transactional, takeover),
                    MINE.0,
                );
                let leaves = explore(&flow, &first, &first, &Trace::default());
                assert!(leaves > 100, "{leaves} leaves");
            }
        }
    }

    #[test]
    fn a_too_large_response_commits_the_not_retained_problem_under_either_policy() {
        let problem = not_retained_response().encode().expect("encodes");
        for transactional in [true, false] {
            for takeover in [TakeoverPolicy::ReRun, TakeoverPolicy::OutcomeUnknown] {
                for truncated in [false, true] {
                    let (mut flow, _) = ServerFlow::start(
                        ScopeId::from_bytes([3; 32]),
                        fp('a'),
                        config(transactional, takeover),
                        MINE.0,
                    );
                    let feed = |flow: &mut ServerFlow, e: Event| flow.handle(e).expect("accepted");
                    assert!(matches!(
                        feed(
                            &mut flow,
                            Event::Store(StoreResult::Claimed {
                                generation: 1,
                                now_ms: NOW
                            })
                        ),
                        Action::RunHandler(_)
                    ));
                    // Too large by length, or a small prefix the host stopped recording.
                    let mut response = HandlerResponse::new(201, vec![], b"far too large".to_vec());
                    if truncated {
                        response.body = b"far".to_vec();
                        response.body_truncated = true;
                    }
                    let action = feed(&mut flow, Event::HandlerFinished(response));
                    assert!(
                        matches!(
                            &action,
                            Action::Store(StoreOp::Complete { response, token, .. })
                                if *response == problem && *token == MINE
                        ),
                        "{action:?}"
                    );
                    let mut end = feed(&mut flow, Event::Store(StoreResult::Completed(true)));
                    if transactional {
                        assert!(matches!(end, Action::Store(StoreOp::Commit { .. })));
                        end = feed(&mut flow, Event::Store(StoreResult::Committed));
                    }
                    let want: &[u8] = if truncated { b"far" } else { b"far too large" };
                    assert!(matches!(
                        end,
                        Action::Respond { ref response, outcome: Outcome::NotRetained }
                            if response.body == want && response.status == 201
                    ));
                }
            }
        }
    }

    #[test]
    fn a_framework_rejection_is_released_whatever_its_status() {
        for status in [201, 400, 422] {
            let (mut flow, _) = ServerFlow::start(
                ScopeId::from_bytes([3; 32]),
                fp('a'),
                config(false, TakeoverPolicy::OutcomeUnknown),
                MINE.0,
            );
            let _ = flow
                .handle(Event::Store(StoreResult::Claimed {
                    generation: 1,
                    now_ms: NOW,
                }))
                .expect("accepted");
            let mut response = HandlerResponse::new(status, vec![], b"{}".to_vec());
            response.origin = ResponseOrigin::Framework;
            assert!(matches!(
                flow.handle(Event::HandlerFinished(response)),
                Ok(Action::Store(StoreOp::Release { .. }))
            ));
        }
    }

    #[test]
    fn a_lock_wait_is_in_flight_and_leaves_no_cleanup() {
        for transactional in [true, false] {
            let (mut flow, _) = ServerFlow::start(
                ScopeId::from_bytes([3; 32]),
                fp('a'),
                config(transactional, TakeoverPolicy::OutcomeUnknown),
                MINE.0,
            );
            let end = flow
                .handle(Event::Store(StoreResult::Locked { now_ms: NOW }))
                .expect("accepted");
            assert!(matches!(
                end,
                Action::Respond { ref response, outcome: Outcome::InFlight }
                    if response.status == 409
                        && response.headers.iter().any(|(n, v)| n == "retry-after" && v == "1")
            ));
            assert_eq!(flow.cleanup(), None);
        }
    }
}
