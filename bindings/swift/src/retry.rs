//! The client retry policy over the FFI (`idempo_core::retry`).
//!
//! Core's own types cross the boundary: each is declared here once for uniffi with
//! `#[uniffi::remote]` (the declaration must match core's definition, which the compiler checks),
//! so there is no mirror type and no conversion table. Only the error enum is this crate's.
use idempo_core::retry as core;
pub use idempo_core::retry::{AttemptOutcome, Jitter, RetryConfig, RetryDecision, StopReason};

/// How a random sample spreads the backoff (core's `Jitter`, declared for uniffi: the same type).
#[uniffi::remote(Enum)]
pub enum Jitter {
    /// At least half the backoff (the default).
    Equal,
    /// Anywhere between zero and the backoff.
    Full,
}

/// The tunable numbers of the retry policy (core's own type, validated on every call).
#[uniffi::remote(Record)]
pub struct RetryConfig {
    /// Attempts in all, the first included (at least 1).
    pub max_attempts: u32,
    /// Backoff cap after the first attempt, in ms (at least 1).
    pub base_delay_ms: u64,
    /// Largest backoff, in ms (at least `base_delay_ms`, at most one day).
    pub max_delay_ms: u64,
    /// Total time budget from the start of the first attempt, in ms (at most seven days).
    pub max_elapsed_ms: u64,
    /// Jitter mode.
    pub jitter: Jitter,
}

/// What happened to one attempt, as the client saw it (core's own type).
#[uniffi::remote(Enum)]
pub enum AttemptOutcome {
    /// A response arrived.
    Response {
        /// The HTTP status code (100..=599).
        status: u16,
        /// The `Retry-After` delay from [`parse_retry_after`], if any.
        retry_after_ms: Option<u64>,
    },
    /// No response within the client's timeout.
    Timeout,
    /// The connection failed or broke.
    ConnectionError,
    /// The server answered idempo's outcome-unknown problem (see
    /// [`attempt_outcome_from_response`]): retrying this key cannot change the answer; the
    /// caller must reconcile, not mint a new key blindly.
    OutcomeUnknown,
    /// idempo's 422 key-reused problem: the key was used for a different request.
    KeyReused,
    /// idempo's 409 in-flight problem: an earlier attempt is still running (retried).
    InFlight {
        /// The `Retry-After` delay from [`parse_retry_after`], if any.
        retry_after_ms: Option<u64>,
    },
    /// idempo's 500 response-not-retained problem: the request was processed but its response
    /// was too large to keep; look the resource up.
    ResponseNotRetained,
}

/// Why the client should stop retrying (core's own type).
#[uniffi::remote(Enum)]
pub enum StopReason {
    /// A 2xx (a replay of an earlier success too).
    Success,
    /// A 3xx.
    Redirection,
    /// A 1xx as a final status.
    Informational,
    /// idempo's 422 key-reused problem: the key was used with a different request; a new intent
    /// needs a new key.
    KeyReusedWithDifferentRequest,
    /// Another 4xx (the application's own 409 or 422 included: its answer, not key reuse).
    ClientError {
        /// The status received.
        status: u16,
    },
    /// A 5xx that says a repeat cannot succeed.
    ServerErrorNotRetryable {
        /// The status received.
        status: u16,
    },
    /// `max_attempts` attempts have been made.
    AttemptsExhausted,
    /// The next attempt would start after `max_elapsed_ms`.
    TimeBudgetExhausted,
    /// The server's `Retry-After` exceeds the remaining time budget.
    RetryAfterBeyondBudget,
    /// The server answered idempo's outcome-unknown problem: an earlier attempt may have taken
    /// effect. Retrying cannot help; reconcile before any new key.
    OutcomeUnknown,
    /// The server answered idempo's response-not-retained problem: the request was processed
    /// but its response was too large to keep. Look the resource up.
    ResponseNotRetained,
}

/// What the client should do after an attempt (core's own type).
#[uniffi::remote(Enum)]
pub enum RetryDecision {
    /// Wait `delay_ms`, then send the same request with the same key.
    Retry {
        /// Milliseconds to wait.
        delay_ms: u64,
    },
    /// Do not retry.
    Stop {
        /// Why.
        reason: StopReason,
    },
}

/// A retry configuration or decision input that core refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum RetryError {
    /// The [`RetryConfig`] is out of range.
    #[error("{message}")]
    InvalidConfig {
        /// Core's stable snake_case code, e.g. `base_above_max`.
        code: String,
        /// Core's message.
        message: String,
    },
    /// An input to [`retry_decide`] is out of its domain (attempt 0, jitter outside `[0, 1)`,
    /// status outside 100..=599).
    #[error("{message}")]
    InvalidInput {
        /// Core's stable snake_case code, e.g. `invalid_jitter`.
        code: String,
        /// Core's message.
        message: String,
    },
}

impl From<core::RetryConfigError> for RetryError {
    fn from(e: core::RetryConfigError) -> Self {
        RetryError::InvalidConfig {
            code: e.code().to_owned(),
            message: e.to_string(),
        }
    }
}

impl From<core::RetryInputError> for RetryError {
    fn from(e: core::RetryInputError) -> Self {
        RetryError::InvalidInput {
            code: e.code().to_owned(),
            message: e.to_string(),
        }
    }
}

/// Core's default retry configuration (5 attempts, 500 ms base, 10 s cap, 60 s budget, equal
/// jitter).
#[must_use]
#[uniffi::export]
pub fn default_retry_config() -> RetryConfig {
    core::RetryConfig::default()
}

/// Checks a configuration without deciding anything (lets a client fail at construction).
///
/// # Errors
/// `InvalidConfig` naming the first field out of range.
#[uniffi::export]
pub fn validate_retry_config(config: RetryConfig) -> Result<(), RetryError> {
    core::RetryPolicy::new(config)?;
    Ok(())
}

/// Decides what to do after attempt number `attempt` (1-based) ended with `outcome`,
/// `elapsed_ms` after the first attempt started, given a uniform sample `jitter` in `[0, 1)`.
///
/// # Errors
/// `InvalidConfig` for a bad `config`, `InvalidInput` for an out-of-domain input.
#[uniffi::export]
pub fn retry_decide(
    config: RetryConfig,
    attempt: u32,
    elapsed_ms: u64,
    outcome: AttemptOutcome,
    jitter: f64,
) -> Result<RetryDecision, RetryError> {
    let policy = core::RetryPolicy::new(config)?;
    Ok(policy.decide(attempt, elapsed_ms, &outcome, jitter)?)
}

/// Classifies a response that arrived (core `AttemptOutcome::from_response`):
/// `OutcomeUnknown` for idempo's outcome-unknown problem (a 500 `application/problem+json` whose
/// `type` is `urn:idempo:problem:outcome-unknown`), otherwise `Response { status,
/// retry_after_ms }`.
#[must_use]
#[uniffi::export]
pub fn attempt_outcome_from_response(
    status: u16,
    retry_after_ms: Option<u64>,
    content_type: Option<String>,
    body: Vec<u8>,
) -> AttemptOutcome {
    core::AttemptOutcome::from_response(status, retry_after_ms, content_type.as_deref(), &body)
}

/// Reads a `Retry-After` value (delay-seconds or an HTTP-date relative to `now_unix_ms`) as a
/// delay in milliseconds; `None` when it is unreadable.
#[must_use]
#[uniffi::export]
pub fn parse_retry_after(value: String, now_unix_ms: u64) -> Option<u64> {
    core::parse_retry_after(&value, now_unix_ms)
}

/// Core's stable snake_case code of a stop reason, e.g. `key_reused_with_different_request`.
#[must_use]
#[uniffi::export]
pub fn stop_reason_code(reason: StopReason) -> String {
    reason.code().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, retry_after_ms: Option<u64>) -> AttemptOutcome {
        AttemptOutcome::Response {
            status,
            retry_after_ms,
        }
    }

    #[test]
    fn conflict_with_retry_after_waits_at_least_that_long() {
        let in_flight = AttemptOutcome::InFlight {
            retry_after_ms: Some(2000),
        };
        let d = retry_decide(default_retry_config(), 1, 0, in_flight, 0.0).unwrap();
        assert_eq!(d, RetryDecision::Retry { delay_ms: 2000 });
        // An application's own 409 is its answer: not retried.
        let d = retry_decide(default_retry_config(), 1, 0, response(409, Some(2000)), 0.0).unwrap();
        assert_eq!(
            d,
            RetryDecision::Stop {
                reason: StopReason::ClientError { status: 409 }
            }
        );
    }

    #[test]
    fn unprocessable_and_client_errors_stop() {
        let cfg = default_retry_config();
        let d = retry_decide(cfg, 1, 0, AttemptOutcome::KeyReused, 0.5).unwrap();
        assert_eq!(
            d,
            RetryDecision::Stop {
                reason: StopReason::KeyReusedWithDifferentRequest
            }
        );
        // An application's own 422 is a client error, never key reuse.
        let d = retry_decide(cfg, 1, 0, response(422, None), 0.5).unwrap();
        assert_eq!(
            d,
            RetryDecision::Stop {
                reason: StopReason::ClientError { status: 422 }
            }
        );
        let d = retry_decide(cfg, 1, 0, response(404, None), 0.5).unwrap();
        assert_eq!(
            d,
            RetryDecision::Stop {
                reason: StopReason::ClientError { status: 404 }
            }
        );
    }

    #[test]
    fn timeouts_and_connection_errors_retry_with_equal_jitter() {
        let cfg = default_retry_config();
        // Equal jitter after attempt 1: cap 500, delay = 250 + floor(0.5 * 250) = 375.
        for outcome in [AttemptOutcome::Timeout, AttemptOutcome::ConnectionError] {
            let d = retry_decide(cfg, 1, 0, outcome, 0.5).unwrap();
            assert_eq!(d, RetryDecision::Retry { delay_ms: 375 });
        }
        let d = retry_decide(cfg, cfg.max_attempts, 0, AttemptOutcome::Timeout, 0.5).unwrap();
        assert_eq!(
            d,
            RetryDecision::Stop {
                reason: StopReason::AttemptsExhausted
            }
        );
    }

    #[test]
    fn bad_inputs_and_configs_are_typed_errors() {
        let cfg = default_retry_config();
        let err = retry_decide(cfg, 1, 0, AttemptOutcome::Timeout, 1.0).unwrap_err();
        assert!(
            matches!(err, RetryError::InvalidInput { ref code, .. } if code == "invalid_jitter")
        );
        let err = retry_decide(cfg, 0, 0, AttemptOutcome::Timeout, 0.0).unwrap_err();
        assert!(matches!(err, RetryError::InvalidInput { ref code, .. } if code == "zero_attempt"));
        let bad = RetryConfig {
            base_delay_ms: 20_000,
            ..cfg
        };
        let err = validate_retry_config(bad).unwrap_err();
        assert!(
            matches!(err, RetryError::InvalidConfig { ref code, .. } if code == "base_above_max")
        );
        assert!(validate_retry_config(cfg).is_ok());
    }

    #[test]
    fn retry_after_and_codes_come_from_core() {
        assert_eq!(parse_retry_after(" 3 ".into(), 0), Some(3000));
        assert_eq!(parse_retry_after("soon".into(), 0), None);
        // 1994-11-06 08:49:37 GMT is 784111777 s after the epoch.
        let now = 784_111_777_000 - 1500;
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT".into(), now),
            Some(1500)
        );
        assert_eq!(
            stop_reason_code(StopReason::KeyReusedWithDifferentRequest),
            "key_reused_with_different_request"
        );
        assert_eq!(
            stop_reason_code(StopReason::ClientError { status: 400 }),
            "client_error"
        );
    }

    #[test]
    fn stop_reasons_round_trip_through_core() {
        let all = [
            StopReason::Success,
            StopReason::Redirection,
            StopReason::Informational,
            StopReason::KeyReusedWithDifferentRequest,
            StopReason::ClientError { status: 404 },
            StopReason::ServerErrorNotRetryable { status: 501 },
            StopReason::AttemptsExhausted,
            StopReason::TimeBudgetExhausted,
            StopReason::RetryAfterBeyondBudget,
            StopReason::OutcomeUnknown,
        ];
        let mut codes = std::collections::HashSet::new();
        for reason in all {
            assert!(codes.insert(stop_reason_code(reason)));
        }
    }

    #[test]
    fn outcome_unknown_is_classified_and_stops() {
        let body = br#"{"type":"urn:idempo:problem:outcome-unknown","status":500}"#.to_vec();
        let o = attempt_outcome_from_response(
            500,
            None,
            Some("application/problem+json".into()),
            body.clone(),
        );
        assert_eq!(o, AttemptOutcome::OutcomeUnknown);
        assert_eq!(
            attempt_outcome_from_response(500, Some(7), None, body),
            response(500, Some(7))
        );
        let d = retry_decide(default_retry_config(), 1, 0, o, 0.5).unwrap();
        assert_eq!(
            d,
            RetryDecision::Stop {
                reason: StopReason::OutcomeUnknown
            }
        );
        assert_eq!(
            stop_reason_code(StopReason::OutcomeUnknown),
            "outcome_unknown"
        );
    }

    #[test]
    fn the_default_config_is_cores() {
        assert_eq!(default_retry_config(), core::RetryConfig::default());
    }
}
