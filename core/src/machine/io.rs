//! The host's I/O vocabulary: what a [`ServerFlow`](super::ServerFlow) asks the host to do
//! ([`Action`], [`StoreOp`], [`RunHandler`]), what the host feeds back ([`Event`],
//! [`StoreResult`], [`HandlerResponse`]), and what the request ended as ([`Outcome`],
//! [`HttpResponse`]); plus the pure helpers a host needs around them: the downstream key, the
//! replay of a stored response, and the answer to a request without a key.
use sha2::{Digest, Sha256};

use crate::policy::ResponseOrigin;
use crate::record::{FencingToken, FingerprintText, Record, StoredResponse, hex};
use crate::scope::ScopeId;

/// The replay marker header added to every replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

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

    pub(super) fn into_http(self) -> HttpResponse {
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

pub(super) fn replay_owned(stored: StoredResponse) -> HttpResponse {
    let mut headers = stored.headers;
    headers.push((REPLAYED_HEADER.to_owned(), "true".to_owned()));
    HttpResponse {
        status: stored.status,
        headers,
        body: stored.body,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_downstream_key_reads_back_as_its_hex_text() {
        let fp = FingerprintText::new(format!("v1:{}", "a".repeat(64))).expect("valid");
        let key = downstream_key(&ScopeId::from_bytes([3; 32]), &fp, 1);
        let text = key.as_str();
        assert_eq!(text.len(), 64);
        assert!(text.bytes().all(|b| b.is_ascii_hexdigit()), "{text}");
        assert_eq!(key.to_string(), text);
        assert_ne!(
            downstream_key(&ScopeId::from_bytes([3; 32]), &fp, 2).as_str(),
            text
        );
    }

    /// The outcomes in which this flow ran the handler (its metrics and logs say so).
    #[test]
    fn handler_ran_is_true_exactly_where_the_handler_ran() {
        let ran = [
            Outcome::Stored,
            Outcome::NotStored,
            Outcome::NotRetained,
            Outcome::LeaseLost,
            Outcome::CompletionFailed,
            Outcome::NotCommitted,
            Outcome::HandlerFailed,
        ];
        for o in crate::machine::call::OUTCOMES {
            assert_eq!(o.handler_ran(), ran.contains(&o), "{o:?}");
        }
    }
}
