//! Client intents: one key per user intent, bound to the request it was minted for.
//!
//! The normative text is `spec/KEYS.md` §3.6, pinned by `spec/vectors/intent/`. A client that
//! keeps pending keys (Swift's `IdempotentClient`, Python's and Node's clients with `intent`)
//! stores, per intent, a [`PendingIntent`]: the key, the fingerprint of the request it was minted
//! for ([`request_fingerprint`]) and when it was created. Then, for every send:
//!
//! 1. The host computes the request's fingerprint and asks its store to **get or create** the
//!    intent's record atomically (a fresh key from the host's CSPRNG as the candidate), so two
//!    callers, processes or app launches cannot mint two keys for one intent.
//! 2. [`decide_send`] says what to do with the record the store returned: send under its key
//!    ([`IntentSend::Reuse`]), or refuse locally and send nothing
//!    ([`IntentRefusal::ChangedWhilePending`]: a different request under an intent whose key is
//!    still pending; the earlier attempt may have run, so the app reconciles first).
//! 3. When the retry policy stops, [`StopReason::settles_intent`] says whether the answer is
//!    definitive for the intent (the record is removed) or the key stays pending.
//!
//! Pure like the rest of core: the host supplies the clock, the entropy and the store.
use thiserror::Error;

use crate::fingerprint::{Fingerprint, FingerprintConfig, FingerprintError, RequestParts};
use crate::retry::StopReason;

/// The pending record of one intent, as a client's pending-key store keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingIntent {
    /// The key text (decoded), sent with every attempt of the intent.
    pub key: String,
    /// The fingerprint text (`v1:…`) of the request the key was minted for
    /// ([`request_fingerprint`]).
    pub fingerprint: String,
    /// When the record was created, in unix milliseconds (the host's wall clock; informational:
    /// it lets an app list old pending intents to reconcile).
    pub created_ms: u64,
}

/// What a client does with a send under an intent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntentSend {
    /// Nothing is pending for the intent: mint a fresh key, store the record (get-or-create),
    /// then send. (A host that uses get-or-create passes the record the store returned instead
    /// and never sees this.)
    Mint,
    /// Send under the pending record's key (the same request: a retry, a second tap, a relaunch).
    Reuse,
    /// Send nothing: see the refusal.
    Refuse(IntentRefusal),
}

/// Why a send under an intent is refused locally (nothing is sent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IntentRefusal {
    /// The request differs from the one the pending key was minted for. The earlier attempt may
    /// have run: the app reconciles (checks the resource), then settles the intent
    /// (removes its pending record) before sending the changed request as a new intent.
    ChangedWhilePending,
    /// The caller passed an explicit key that is not the intent's pending key.
    KeyDiffersFromPending,
}

impl IntentRefusal {
    /// Stable snake_case code (`intent_changed_while_pending`, `intent_key_differs_from_pending`).
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            IntentRefusal::ChangedWhilePending => "intent_changed_while_pending",
            IntentRefusal::KeyDiffersFromPending => "intent_key_differs_from_pending",
        }
    }
}

impl IntentSend {
    /// Stable snake_case code: `mint`, `reuse`, or the refusal's code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            IntentSend::Mint => "mint",
            IntentSend::Reuse => "reuse",
            IntentSend::Refuse(r) => r.code(),
        }
    }
}

/// An input of [`decide_send`] that is not a fingerprint text.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum IntentError {
    /// The pending record's fingerprint does not parse: the store holds something core did not
    /// write. Refused (fail closed); the app inspects or removes the record.
    #[error("the pending record's fingerprint is not a fingerprint text ({0})")]
    InvalidPendingFingerprint(&'static str),
    /// The request fingerprint passed does not parse.
    #[error("the request fingerprint is not a fingerprint text ({0})")]
    InvalidRequestFingerprint(&'static str),
}

impl IntentError {
    /// Stable snake_case code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            IntentError::InvalidPendingFingerprint(_) => "invalid_pending_fingerprint",
            IntentError::InvalidRequestFingerprint(_) => "invalid_request_fingerprint",
        }
    }
}

/// The fingerprint that binds a client request to its intent's key: core's v1 fingerprint
/// (default configuration) of the method, the request **target** (the full URL the client sends
/// to, in place of a route template), the `Content-Type` and the body (canonical JSON for JSON
/// media types, so member order and whitespace do not matter; raw bytes otherwise). Headers do
/// not take part.
///
/// # Errors
/// [`FingerprintError::Body`] for a body declared JSON that core refuses (a client cannot bind
/// what it cannot fingerprint; the send is refused).
pub fn request_fingerprint(
    method: &str,
    target: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Fingerprint, FingerprintError> {
    let parts = RequestParts {
        method,
        route: target,
        headers: &[],
        content_type,
        body,
    };
    crate::fingerprint::fingerprint(&parts, &FingerprintConfig::default())
}

/// What to do with a send under an intent (`spec/KEYS.md` §3.6).
///
/// `pending` is the intent's record (the one the store returned from get-or-create, or `None`
/// when nothing is stored), `request_fingerprint` the text of [`request_fingerprint`] for this
/// request, `explicit_key` a key the caller insists on (`None` usually).
///
/// - no record → [`IntentSend::Mint`];
/// - a record whose fingerprint differs → [`IntentRefusal::ChangedWhilePending`] (checked first:
///   the request is what matters);
/// - an explicit key other than the record's → [`IntentRefusal::KeyDiffersFromPending`];
/// - otherwise → [`IntentSend::Reuse`].
///
/// Fingerprints are compared in constant time.
///
/// # Errors
/// [`IntentError`] when a fingerprint text does not parse (fail closed).
pub fn decide_send(
    pending: Option<&PendingIntent>,
    request_fingerprint: &str,
    explicit_key: Option<&str>,
) -> Result<IntentSend, IntentError> {
    let request: Fingerprint =
        request_fingerprint
            .parse()
            .map_err(|e: crate::fingerprint::ParseFingerprintError| {
                IntentError::InvalidRequestFingerprint(e.code())
            })?;
    let Some(pending) = pending else {
        return Ok(IntentSend::Mint);
    };
    let stored: Fingerprint =
        pending
            .fingerprint
            .parse()
            .map_err(|e: crate::fingerprint::ParseFingerprintError| {
                IntentError::InvalidPendingFingerprint(e.code())
            })?;
    if !stored.ct_eq(&request) {
        return Ok(IntentSend::Refuse(IntentRefusal::ChangedWhilePending));
    }
    if explicit_key.is_some_and(|k| k != pending.key) {
        return Ok(IntentSend::Refuse(IntentRefusal::KeyDiffersFromPending));
    }
    Ok(IntentSend::Reuse)
}

impl StopReason {
    /// Whether a stop with this reason settles the intent (its pending record is removed) or
    /// leaves its key pending (`spec/KEYS.md` §3.6).
    ///
    /// Settled: the server's definitive answer: 1xx, 2xx, 3xx, other 4xx (the application's own
    /// 409 or 422 included), 5xx that cannot succeed, and idempo's key-reused 422 (the key
    /// belongs to another request: this intent needs a new one). Pending: the budget ran out on
    /// retryable outcomes (the request may have run), idempo's outcome-unknown (reconcile first)
    /// and response-not-retained (it ran; look the resource up, never mint a new key for it).
    /// A send that ends without a stop (cancellation, a transport error the policy never saw)
    /// leaves the key pending too.
    #[must_use]
    pub fn settles_intent(&self) -> bool {
        match self {
            StopReason::Success
            | StopReason::Redirection
            | StopReason::Informational
            | StopReason::KeyReusedWithDifferentRequest
            | StopReason::ClientError { .. }
            | StopReason::ServerErrorNotRetryable { .. } => true,
            StopReason::AttemptsExhausted
            | StopReason::TimeBudgetExhausted
            | StopReason::RetryAfterBeyondBudget
            | StopReason::OutcomeUnknown
            | StopReason::ResponseNotRetained => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"amount":100,"currency":"EUR"}"#;

    fn fp(body: &[u8]) -> String {
        request_fingerprint(
            "POST",
            "https://api.example/payments",
            Some("application/json"),
            body,
        )
        .unwrap()
        .to_string()
    }

    fn record(fingerprint: &str) -> PendingIntent {
        PendingIntent {
            key: "k-12345678".into(),
            fingerprint: fingerprint.into(),
            created_ms: 1,
        }
    }

    #[test]
    fn the_request_binds_the_key() {
        let a = fp(BODY);
        assert_eq!(
            a,
            fp(br#"{ "currency": "EUR", "amount": 100 }"#),
            "canonical JSON"
        );
        let b = fp(br#"{"amount":250,"currency":"EUR"}"#);
        assert_eq!(decide_send(None, &a, None), Ok(IntentSend::Mint));
        assert_eq!(
            decide_send(Some(&record(&a)), &a, None),
            Ok(IntentSend::Reuse)
        );
        assert_eq!(
            decide_send(Some(&record(&a)), &b, None),
            Ok(IntentSend::Refuse(IntentRefusal::ChangedWhilePending))
        );
        assert_eq!(
            decide_send(Some(&record(&a)), &a, Some("k-12345678")),
            Ok(IntentSend::Reuse)
        );
        assert_eq!(
            decide_send(Some(&record(&a)), &a, Some("other-key")),
            Ok(IntentSend::Refuse(IntentRefusal::KeyDiffersFromPending))
        );
        assert_eq!(
            decide_send(Some(&record("v1:zz")), &a, None)
                .unwrap_err()
                .code(),
            "invalid_pending_fingerprint"
        );
        assert_eq!(
            decide_send(None, "x", None).unwrap_err().code(),
            "invalid_request_fingerprint"
        );
    }

    #[test]
    fn method_target_and_content_type_take_part() {
        let base = fp(BODY);
        let other_target = request_fingerprint(
            "POST",
            "https://api.example/refunds",
            Some("application/json"),
            BODY,
        )
        .unwrap();
        assert_ne!(base, other_target.to_string());
        let put = request_fingerprint(
            "PUT",
            "https://api.example/payments",
            Some("application/json"),
            BODY,
        )
        .unwrap();
        assert_ne!(base, put.to_string());
        let raw = request_fingerprint("POST", "https://api.example/payments", None, BODY).unwrap();
        assert_ne!(base, raw.to_string());
        assert!(request_fingerprint("POST", "/p", Some("application/json"), b"not json").is_err());
    }

    #[test]
    fn which_stops_settle_the_intent() {
        assert!(StopReason::Success.settles_intent());
        assert!(StopReason::ClientError { status: 422 }.settles_intent());
        assert!(StopReason::KeyReusedWithDifferentRequest.settles_intent());
        assert!(!StopReason::OutcomeUnknown.settles_intent());
        assert!(!StopReason::ResponseNotRetained.settles_intent());
        assert!(!StopReason::AttemptsExhausted.settles_intent());
        assert!(!StopReason::TimeBudgetExhausted.settles_intent());
        assert!(!StopReason::RetryAfterBeyondBudget.settles_intent());
    }
}
