//! # idempo-swift
//!
//! The uniffi FFI layer of idempo for Swift. Every function is a thin wrapper over
//! [`idempo_core`]: it converts FFI records to core types, calls core, and converts the result or
//! the core error back. There is no protocol logic here; the hand-written Swift package
//! (`bindings/swift/Sources/Idempo`) builds the idiomatic API on top.
//!
//! Like core, this crate reads no clock and draws no randomness: entropy for a fresh key, the
//! current time for `Retry-After` dates and the jitter sample are parameters supplied by Swift.
//!
//! Errors are typed `uniffi::Error` enums converted from core errors with `From`; each variant
//! carries core's stable snake_case `code` where core has one, and core's message. No function
//! panics on bad input, so nothing unwinds across the FFI boundary.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

uniffi::setup_scaffolding!();

mod canonical;
mod fingerprint;
mod intent;
mod key;
mod retry;
mod scope;

pub use canonical::{
    CanonicalError, CanonicalOptions, NumberMode, canonicalize, canonicalize_excluding,
    canonicalize_with, default_canonical_options,
};
pub use fingerprint::{
    FingerprintConfig, FingerprintError, FingerprintRequest, Header, default_fingerprint_config,
    fingerprint, fingerprints_equal, is_json_media_type, parse_fingerprint,
};
pub use intent::{
    IntentError, IntentSendDecision, PendingIntentRecord, intent_decide_send,
    intent_request_fingerprint, intent_send_code, stop_reason_settles_intent,
};
pub use key::{
    KeyError, KeyForm, KeyOptions, ParsedKey, default_key_options, generate_key, key_header_value,
    parse_key, parse_key_bytes, validate_key_text,
};
pub use retry::{
    AttemptOutcome, JitterMode, RetryConfig, RetryDecision, RetryError, StopReason,
    attempt_outcome_from_response, default_retry_config, parse_retry_after, retry_decide,
    stop_reason_code, validate_retry_config,
};
pub use scope::scope_id_hex;

/// Converts a length or offset to the `u64` used on the FFI (lossless on every supported target).
fn to_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Converts an FFI `u64` to `usize`, saturating on 32-bit targets (only used for limits, where a
/// saturated value means "no smaller than the caller asked").
fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}
