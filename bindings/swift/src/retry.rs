//! The client retry policy over the FFI (`idempo_core::retry`).
use idempo_core::retry as core;

/// How a random sample spreads the backoff (core `Jitter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum JitterMode {
    /// At least half the backoff (the default).
    Equal,
    /// Anywhere between zero and the backoff.
    Full,
}

/// The tunable numbers of the retry policy (core `RetryConfig`, validated on every call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Record)]
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
    pub jitter: JitterMode,
}

/// What happened to one attempt, as the client saw it (core `AttemptOutcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
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

/// Why the client should stop retrying (core `StopReason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
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

/// What the client should do after an attempt (core `RetryDecision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
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

impl From<core::Jitter> for JitterMode {
    fn from(j: core::Jitter) -> Self {
        match j {
            core::Jitter::Equal => JitterMode::Equal,
            core::Jitter::Full => JitterMode::Full,
        }
    }
}

impl From<JitterMode> for core::Jitter {
    fn from(j: JitterMode) -> Self {
        match j {
            JitterMode::Equal => core::Jitter::Equal,
            JitterMode::Full => core::Jitter::Full,
        }
    }
}

impl From<core::RetryConfig> for RetryConfig {
    fn from(c: core::RetryConfig) -> Self {
        RetryConfig {
            max_attempts: c.max_attempts,
            base_delay_ms: c.base_delay_ms,
            max_delay_ms: c.max_delay_ms,
            max_elapsed_ms: c.max_elapsed_ms,
            jitter: c.jitter.into(),
        }
    }
}

impl From<RetryConfig> for core::RetryConfig {
    fn from(c: RetryConfig) -> Self {
        core::RetryConfig {
            max_attempts: c.max_attempts,
            base_delay_ms: c.base_delay_ms,
            max_delay_ms: c.max_delay_ms,
            max_elapsed_ms: c.max_elapsed_ms,
            jitter: c.jitter.into(),
        }
    }
}

impl TryFrom<RetryConfig> for core::RetryPolicy {
    type Error = RetryError;

    fn try_from(c: RetryConfig) -> Result<Self, RetryError> {
        Ok(core::RetryPolicy::new(c.into())?)
    }
}

impl From<AttemptOutcome> for core::AttemptOutcome {
    fn from(o: AttemptOutcome) -> Self {
        match o {
            AttemptOutcome::Response {
                status,
                retry_after_ms,
            } => core::AttemptOutcome::Response {
                status,
                retry_after_ms,
            },
            AttemptOutcome::Timeout => core::AttemptOutcome::Timeout,
            AttemptOutcome::ConnectionError => core::AttemptOutcome::ConnectionError,
            AttemptOutcome::OutcomeUnknown => core::AttemptOutcome::OutcomeUnknown,
            AttemptOutcome::KeyReused => core::AttemptOutcome::KeyReused,
            AttemptOutcome::InFlight { retry_after_ms } => {
                core::AttemptOutcome::InFlight { retry_after_ms }
            }
            AttemptOutcome::ResponseNotRetained => core::AttemptOutcome::ResponseNotRetained,
        }
    }
}

impl From<core::AttemptOutcome> for AttemptOutcome {
    fn from(o: core::AttemptOutcome) -> Self {
        match o {
            core::AttemptOutcome::Response {
                status,
                retry_after_ms,
            } => AttemptOutcome::Response {
                status,
                retry_after_ms,
            },
            core::AttemptOutcome::Timeout => AttemptOutcome::Timeout,
            core::AttemptOutcome::ConnectionError => AttemptOutcome::ConnectionError,
            core::AttemptOutcome::OutcomeUnknown => AttemptOutcome::OutcomeUnknown,
            core::AttemptOutcome::KeyReused => AttemptOutcome::KeyReused,
            core::AttemptOutcome::InFlight { retry_after_ms } => {
                AttemptOutcome::InFlight { retry_after_ms }
            }
            core::AttemptOutcome::ResponseNotRetained => AttemptOutcome::ResponseNotRetained,
        }
    }
}

impl From<core::StopReason> for StopReason {
    fn from(r: core::StopReason) -> Self {
        match r {
            core::StopReason::Success => StopReason::Success,
            core::StopReason::Redirection => StopReason::Redirection,
            core::StopReason::Informational => StopReason::Informational,
            core::StopReason::KeyReusedWithDifferentRequest => {
                StopReason::KeyReusedWithDifferentRequest
            }
            core::StopReason::ClientError { status } => StopReason::ClientError { status },
            core::StopReason::ServerErrorNotRetryable { status } => {
                StopReason::ServerErrorNotRetryable { status }
            }
            core::StopReason::AttemptsExhausted => StopReason::AttemptsExhausted,
            core::StopReason::TimeBudgetExhausted => StopReason::TimeBudgetExhausted,
            core::StopReason::RetryAfterBeyondBudget => StopReason::RetryAfterBeyondBudget,
            core::StopReason::OutcomeUnknown => StopReason::OutcomeUnknown,
            core::StopReason::ResponseNotRetained => StopReason::ResponseNotRetained,
        }
    }
}

impl From<StopReason> for core::StopReason {
    fn from(r: StopReason) -> Self {
        match r {
            StopReason::Success => core::StopReason::Success,
            StopReason::Redirection => core::StopReason::Redirection,
            StopReason::Informational => core::StopReason::Informational,
            StopReason::KeyReusedWithDifferentRequest => {
                core::StopReason::KeyReusedWithDifferentRequest
            }
            StopReason::ClientError { status } => core::StopReason::ClientError { status },
            StopReason::ServerErrorNotRetryable { status } => {
                core::StopReason::ServerErrorNotRetryable { status }
            }
            StopReason::AttemptsExhausted => core::StopReason::AttemptsExhausted,
            StopReason::TimeBudgetExhausted => core::StopReason::TimeBudgetExhausted,
            StopReason::RetryAfterBeyondBudget => core::StopReason::RetryAfterBeyondBudget,
            StopReason::OutcomeUnknown => core::StopReason::OutcomeUnknown,
            StopReason::ResponseNotRetained => core::StopReason::ResponseNotRetained,
        }
    }
}

impl From<core::RetryDecision> for RetryDecision {
    fn from(d: core::RetryDecision) -> Self {
        match d {
            core::RetryDecision::Retry { delay_ms } => RetryDecision::Retry { delay_ms },
            core::RetryDecision::Stop { reason } => RetryDecision::Stop {
                reason: reason.into(),
            },
        }
    }
}

/// Core's default retry configuration (5 attempts, 500 ms base, 10 s cap, 60 s budget, equal
/// jitter).
#[must_use]
#[uniffi::export]
pub fn default_retry_config() -> RetryConfig {
    core::RetryConfig::default().into()
}

/// Checks a configuration without deciding anything (lets a client fail at construction).
///
/// # Errors
/// `InvalidConfig` naming the first field out of range.
#[uniffi::export]
pub fn validate_retry_config(config: RetryConfig) -> Result<(), RetryError> {
    core::RetryPolicy::try_from(config).map(|_| ())
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
    let policy = core::RetryPolicy::try_from(config)?;
    Ok(policy
        .decide(attempt, elapsed_ms, &outcome.into(), jitter)?
        .into())
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
        .into()
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
    core::StopReason::from(reason).code().to_owned()
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
            let back: StopReason = core::StopReason::from(reason).into();
            assert_eq!(back, reason);
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
    fn config_round_trips_through_core() {
        let back: core::RetryConfig = default_retry_config().into();
        assert_eq!(back, core::RetryConfig::default());
    }
}
