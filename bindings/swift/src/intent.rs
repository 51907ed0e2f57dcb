//! Client intents over the FFI (`idempo_core::intent`, `spec/KEYS.md` §3.6).
use idempo_core::intent as core;

use crate::fingerprint::FingerprintError;
use crate::retry::StopReason;

/// The pending record of one intent (core `PendingIntent`).
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct PendingIntentRecord {
    /// The key text.
    pub key: String,
    /// The fingerprint text of the request the key was minted for.
    pub fingerprint: String,
    /// Creation time in unix milliseconds.
    pub created_ms: u64,
}

/// What to do with a send under an intent (core `IntentSend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum IntentSendDecision {
    /// Nothing pending: mint a key and store the record.
    Mint,
    /// Send under the record's key.
    Reuse,
    /// Send nothing: the request differs from the pending key's.
    ChangedWhilePending,
    /// Send nothing: the explicit key is not the pending one.
    KeyDiffersFromPending,
}

/// An input of [`intent_decide_send`] that core refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum IntentError {
    /// A fingerprint text does not parse.
    #[error("{message}")]
    InvalidInput {
        /// Core's stable snake_case code (`invalid_pending_fingerprint`, ...).
        code: String,
        /// Core's message.
        message: String,
    },
}

/// The fingerprint binding a client request to its intent's key (core
/// `intent::request_fingerprint`).
#[uniffi::export]
pub fn intent_request_fingerprint(
    method: String,
    target: String,
    content_type: Option<String>,
    body: Vec<u8>,
) -> Result<String, FingerprintError> {
    core::request_fingerprint(&method, &target, content_type.as_deref(), &body)
        .map(|f| f.to_string())
        .map_err(FingerprintError::from)
}

/// What to do with a send under an intent (core `intent::decide_send`).
#[uniffi::export]
pub fn intent_decide_send(
    pending: Option<PendingIntentRecord>,
    request_fingerprint: String,
    explicit_key: Option<String>,
) -> Result<IntentSendDecision, IntentError> {
    let pending = pending.map(|p| core::PendingIntent {
        key: p.key,
        fingerprint: p.fingerprint,
        created_ms: p.created_ms,
    });
    core::decide_send(
        pending.as_ref(),
        &request_fingerprint,
        explicit_key.as_deref(),
    )
    .map(|d| match d {
        core::IntentSend::Mint => IntentSendDecision::Mint,
        core::IntentSend::Reuse => IntentSendDecision::Reuse,
        core::IntentSend::Refuse(core::IntentRefusal::ChangedWhilePending) => {
            IntentSendDecision::ChangedWhilePending
        }
        core::IntentSend::Refuse(core::IntentRefusal::KeyDiffersFromPending) => {
            IntentSendDecision::KeyDiffersFromPending
        }
    })
    .map_err(|e| IntentError::InvalidInput {
        code: e.code().to_owned(),
        message: e.to_string(),
    })
}

/// Core's stable code of a send decision (`mint`, `reuse`, `intent_changed_while_pending`, ...).
#[uniffi::export]
pub fn intent_send_code(decision: IntentSendDecision) -> String {
    match decision {
        IntentSendDecision::Mint => core::IntentSend::Mint,
        IntentSendDecision::Reuse => core::IntentSend::Reuse,
        IntentSendDecision::ChangedWhilePending => {
            core::IntentSend::Refuse(core::IntentRefusal::ChangedWhilePending)
        }
        IntentSendDecision::KeyDiffersFromPending => {
            core::IntentSend::Refuse(core::IntentRefusal::KeyDiffersFromPending)
        }
    }
    .code()
    .to_owned()
}

/// Whether a stop with `reason` settles the intent (core `StopReason::settles_intent`).
#[uniffi::export]
pub fn stop_reason_settles_intent(reason: StopReason) -> bool {
    reason.settles_intent()
}
