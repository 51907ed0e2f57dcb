//! The client retry policy shared by every binding's client helper.
//!
//! The normative algorithm is `spec/KEYS.md` §3, pinned by `spec/vectors/retry/`. Summary:
//!
//! - A retry always reuses the **same** `Idempotency-Key`: that is what makes it safe. A new
//!   key is only for a new user intent (and after a 422, which says the key was used for a
//!   different request).
//! - **Retried**: timeouts, connection errors, idempo's `in-flight` 409 (the first request is
//!   still in flight; [`AttemptOutcome::InFlight`]), 408, 425, 429 and every 5xx except those
//!   that say a repeat cannot succeed (501, 505, 506, 508, 510, 511).
//! - **Stopped**: 1xx, 2xx, 3xx, idempo's `key-reused` 422
//!   ([`StopReason::KeyReusedWithDifferentRequest`]), every other 4xx (an application's own 409
//!   or 422 included: it is the application's answer, [`StopReason::ClientError`]), idempo's
//!   `outcome-unknown` 500 ([`AttemptOutcome::OutcomeUnknown`]) and `response-not-retained` 500
//!   ([`AttemptOutcome::ResponseNotRetained`]): retrying that key cannot change the answer.
//!   idempo's problems are told apart from the application's responses by
//!   [`AttemptOutcome::from_response`] (status, `application/problem+json`, problem `type`).
//! - **Backoff**: exponential with *equal jitter* by default: `cap = min(max_delay, base·2^(n-1))`
//!   after attempt `n`, then `delay = ⌊cap/2⌋ + ⌊jitter·(cap - ⌊cap/2⌋)⌋` (never more than `cap`).
//!   Equal jitter keeps at least half the backoff, so a 409 storm is never retried at once;
//!   [`Jitter::Full`] (`⌊jitter·cap⌋`) is available.
//! - **`Retry-After`** (already converted to milliseconds by [`parse_retry_after`]) is a floor:
//!   `delay = max(backoff, retry_after)`. It is *not* capped by `max_delay` (retrying before the
//!   server's time only earns another 409/429); instead, when it exceeds the remaining time
//!   budget the policy stops with [`StopReason::RetryAfterBeyondBudget`].
//! - **Bounds**: at most `max_attempts` attempts in all, and no attempt starts later than
//!   `max_elapsed_ms` after the first one started (`elapsed + delay <= max_elapsed`).
//! - **Inputs are validated, never clamped**: `attempt` starts at 1, `jitter` must lie in
//!   `[0, 1)` (NaN, infinities, negatives and 1.0 are refused), statuses in `100..=599`; a bad
//!   input is a [`RetryInputError`], not a silently adjusted decision.
//!
//! Core reads no clock and draws no randomness: the host passes the elapsed time and a uniform
//! jitter sample (e.g. `Math.random()`, `random.random()`).
use thiserror::Error;

use crate::canonical::{CanonOptions, Limits, canonicalize_with};
use crate::machine::problem::{
    IN_FLIGHT_TYPE, KEY_REUSED_TYPE, OUTCOME_UNKNOWN_TYPE, PROBLEM_CONTENT_TYPE,
    RESPONSE_NOT_RETAINED_TYPE,
};

/// The most bytes of a response body [`AttemptOutcome::from_response`] looks at; a longer body
/// is never read as one of idempo's problems (idempo's own are a few hundred bytes).
pub const OUTCOME_UNKNOWN_BODY_LIMIT: usize = 4096;
/// The status idempo answers the outcome-unknown problem with.
pub const OUTCOME_UNKNOWN_STATUS: u16 = 500;

/// The largest allowed `max_delay_ms`: one day.
pub const MAX_DELAY_LIMIT_MS: u64 = 86_400_000;
/// The largest allowed `max_elapsed_ms`: seven days.
pub const MAX_ELAPSED_LIMIT_MS: u64 = 604_800_000;
/// `Retry-After` delta-seconds larger than this are read as this (2^31 s, as RFC 9111 §1.2.2
/// does for delta-seconds that overflow).
pub const RETRY_AFTER_MAX_SECONDS: u64 = 2_147_483_648;

/// How a random sample spreads the backoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Jitter {
    /// `delay = ⌊cap/2⌋ + ⌊jitter·(cap − ⌊cap/2⌋)⌋`: at least half the backoff (the default).
    Equal,
    /// `delay = ⌊jitter·cap⌋`: anywhere in `[0, cap]`; spreads load most, may retry at once.
    Full,
}

// `Jitter::as_str`, `FromStr` and `Display` live in `crate::vocab`.

/// The tunable numbers of a [`RetryPolicy`], checked by [`RetryPolicy::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryConfig {
    /// Attempts in all, the first included (default 5). At least 1; 1 means never retry.
    pub max_attempts: u32,
    /// Backoff cap after the first attempt, in ms (default 500). At least 1.
    pub base_delay_ms: u64,
    /// Largest backoff, in ms (default 10,000). At least `base_delay_ms`, at most one day.
    /// Does not cap a server's `Retry-After`.
    pub max_delay_ms: u64,
    /// Total time budget from the start of the first attempt, in ms (default 60,000; at most
    /// seven days). No attempt starts after it.
    pub max_elapsed_ms: u64,
    /// Jitter mode (default [`Jitter::Equal`]).
    pub jitter: Jitter,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 5,
            base_delay_ms: 500,
            max_delay_ms: 10_000,
            max_elapsed_ms: 60_000,
            jitter: Jitter::Equal,
        }
    }
}

/// A [`RetryConfig`] that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RetryConfigError {
    /// `max_attempts` was 0: the first attempt always counts.
    #[error("max_attempts must be at least 1")]
    ZeroAttempts,
    /// `base_delay_ms` was 0 (a retry loop with no delay).
    #[error("base_delay_ms must be at least 1")]
    ZeroBaseDelay,
    /// `base_delay_ms` was greater than `max_delay_ms`.
    #[error("base_delay_ms {base_delay_ms} is greater than max_delay_ms {max_delay_ms}")]
    BaseAboveMax {
        /// The requested base delay.
        base_delay_ms: u64,
        /// The requested maximum delay.
        max_delay_ms: u64,
    },
    /// `max_delay_ms` exceeded [`MAX_DELAY_LIMIT_MS`].
    #[error("max_delay_ms {max_delay_ms} exceeds the limit of {MAX_DELAY_LIMIT_MS}")]
    MaxDelayTooLarge {
        /// The requested maximum delay.
        max_delay_ms: u64,
    },
    /// `max_elapsed_ms` exceeded [`MAX_ELAPSED_LIMIT_MS`].
    #[error("max_elapsed_ms {max_elapsed_ms} exceeds the limit of {MAX_ELAPSED_LIMIT_MS}")]
    MaxElapsedTooLarge {
        /// The requested budget.
        max_elapsed_ms: u64,
    },
}

impl RetryConfigError {
    /// Stable snake_case code for this error.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            RetryConfigError::ZeroAttempts => "zero_attempts",
            RetryConfigError::ZeroBaseDelay => "zero_base_delay",
            RetryConfigError::BaseAboveMax { .. } => "base_above_max",
            RetryConfigError::MaxDelayTooLarge { .. } => "max_delay_too_large",
            RetryConfigError::MaxElapsedTooLarge { .. } => "max_elapsed_too_large",
        }
    }
}

/// What happened to one attempt, as the client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// A response arrived.
    Response {
        /// The HTTP status code (100..=599).
        status: u16,
        /// The response's `Retry-After`, converted with [`parse_retry_after`]; `None` when
        /// absent or unreadable.
        retry_after_ms: Option<u64>,
    },
    /// No response within the client's timeout (the request may or may not have run).
    Timeout,
    /// The connection failed or broke (the request may or may not have run).
    ConnectionError,
    /// The server answered with idempo's outcome-unknown problem (`500`, type
    /// `urn:idempo:problem:outcome-unknown`): an earlier attempt with this key may have taken
    /// effect and its outcome was not recorded. Retrying this key cannot change the answer; the
    /// caller must reconcile (check the resource's state), NOT mint a new key blindly.
    OutcomeUnknown,
    /// The server answered idempo's key-reused problem (`422`, type
    /// `urn:idempo:problem:key-reused`): the key was used for a different request. Stopped with
    /// [`StopReason::KeyReusedWithDifferentRequest`].
    KeyReused,
    /// The server answered idempo's in-flight problem (`409`, type
    /// `urn:idempo:problem:in-flight`): an earlier attempt with this key is still running.
    /// Retried (the `Retry-After` is a floor for the delay).
    InFlight {
        /// The response's `Retry-After` in ms, if it had a usable one.
        retry_after_ms: Option<u64>,
    },
    /// The server answered idempo's response-not-retained problem (`500`, type
    /// `urn:idempo:problem:response-not-retained`): the request was processed, but its response
    /// was too large to keep. Stopped with [`StopReason::ResponseNotRetained`]; the caller looks
    /// the resource up.
    ResponseNotRetained,
}

impl AttemptOutcome {
    /// Classifies a response that arrived (`spec/KEYS.md` §3.5). When `content_type` is
    /// `application/problem+json` (parameters and case ignored) and `body` is a JSON object, at
    /// most [`OUTCOME_UNKNOWN_BODY_LIMIT`] bytes, whose top-level `type` member is idempo's for
    /// that status, the outcome is idempo's problem: 500 [`OUTCOME_UNKNOWN_TYPE`] →
    /// [`AttemptOutcome::OutcomeUnknown`], 500 [`RESPONSE_NOT_RETAINED_TYPE`] →
    /// [`AttemptOutcome::ResponseNotRetained`], 422 [`KEY_REUSED_TYPE`] →
    /// [`AttemptOutcome::KeyReused`], 409 [`IN_FLIGHT_TYPE`] → [`AttemptOutcome::InFlight`].
    /// Anything else (an application's own 409 or 422, a JSON validation error...) is
    /// [`AttemptOutcome::Response`]: the application's answer.
    ///
    /// The body is parsed with core's canonical JSON parser, so whitespace, member order and
    /// escapes do not matter, and a body that is not valid JSON (or has duplicate members) is an
    /// ordinary response. The status is not validated here; [`RetryPolicy::decide`] does that.
    #[must_use]
    pub fn from_response(
        status: u16,
        retry_after_ms: Option<u64>,
        content_type: Option<&str>,
        body: &[u8],
    ) -> AttemptOutcome {
        let response = AttemptOutcome::Response {
            status,
            retry_after_ms,
        };
        if !Self::body_needed(status, content_type) {
            return response;
        }
        let is = |type_uri: &str| has_problem_type(body, type_uri);
        match status {
            OUTCOME_UNKNOWN_STATUS if is(OUTCOME_UNKNOWN_TYPE) => AttemptOutcome::OutcomeUnknown,
            OUTCOME_UNKNOWN_STATUS if is(RESPONSE_NOT_RETAINED_TYPE) => {
                AttemptOutcome::ResponseNotRetained
            }
            422 if is(KEY_REUSED_TYPE) => AttemptOutcome::KeyReused,
            409 if is(IN_FLIGHT_TYPE) => AttemptOutcome::InFlight { retry_after_ms },
            _ => response,
        }
    }

    /// Whether [`AttemptOutcome::from_response`] would look at the body of a response with this
    /// status and content type (a 409, 422 or 500 `application/problem+json`). A client whose
    /// bodies are streams reads the body only when this is true, and passes an empty body
    /// otherwise.
    #[must_use]
    pub fn body_needed(status: u16, content_type: Option<&str>) -> bool {
        matches!(status, 409 | 422 | OUTCOME_UNKNOWN_STATUS)
            && content_type.is_some_and(is_problem_json)
    }

    /// Stable snake_case name of the kind (`response`, `timeout`, `connection_error`,
    /// `outcome_unknown`, `key_reused`, `in_flight`, `response_not_retained`).
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            AttemptOutcome::Response { .. } => "response",
            AttemptOutcome::Timeout => "timeout",
            AttemptOutcome::ConnectionError => "connection_error",
            AttemptOutcome::OutcomeUnknown => "outcome_unknown",
            AttemptOutcome::KeyReused => "key_reused",
            AttemptOutcome::InFlight { .. } => "in_flight",
            AttemptOutcome::ResponseNotRetained => "response_not_retained",
        }
    }
}

/// `application/problem+json`, ignoring parameters, surrounding whitespace and ASCII case.
fn is_problem_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case(PROBLEM_CONTENT_TYPE)
}

/// True when `body` is a JSON object whose top-level `type` member is `type_uri` (one of
/// idempo's problem types, which canonical JSON writes unescaped).
///
/// The body is canonicalized first (RFC 8785: no whitespace, minimal string escapes, sorted
/// members, duplicates refused), then the top-level members are walked byte by byte. The type
/// URI has only characters canonical JSON writes unescaped, so a byte comparison is exact.
fn has_problem_type(body: &[u8], type_uri: &str) -> bool {
    if body.len() > OUTCOME_UNKNOWN_BODY_LIMIT {
        return false;
    }
    let options = CanonOptions {
        limits: Limits {
            max_input_bytes: OUTCOME_UNKNOWN_BODY_LIMIT,
            ..Limits::default()
        },
        ..CanonOptions::default()
    };
    let Ok(canon) = canonicalize_with(body, &options) else {
        return false;
    };
    if canon.first() != Some(&b'{') {
        return false;
    }
    let mut wanted = Vec::with_capacity(type_uri.len() + 10);
    wanted.extend_from_slice(b"\"type\":\"");
    wanted.extend_from_slice(type_uri.as_bytes());
    wanted.push(b'"');
    let member_is_wanted = |start: usize| {
        canon
            .get(start..)
            .and_then(|rest| rest.strip_prefix(wanted.as_slice()))
            .is_some_and(|after| matches!(after.first(), Some(b',' | b'}')))
    };
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in canon.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth == 1 && member_is_wanted(i + 1) {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' if depth == 1 && member_is_wanted(i + 1) => return true,
            _ => {}
        }
    }
    false
}

/// Why the client should stop retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// A 2xx: done (a replay of an earlier success is a 2xx too).
    Success,
    /// A 3xx: not an error, not retried; the caller decides whether to follow it.
    Redirection,
    /// A 1xx as a final status: unexpected, not retried.
    Informational,
    /// idempo's 422 `key-reused` problem: this key was already used with a different request.
    /// Retrying cannot help; a new intent needs a new key.
    KeyReusedWithDifferentRequest,
    /// Another 4xx: the request itself is wrong (e.g. 400 for a missing or invalid key), or the
    /// application's own answer (a business 409 conflict, a 422 validation error).
    ClientError {
        /// The status received.
        status: u16,
    },
    /// A 5xx that says a repeat cannot succeed (501, 505, 506, 508, 510, 511).
    ServerErrorNotRetryable {
        /// The status received.
        status: u16,
    },
    /// The outcome was retryable but `max_attempts` attempts have been made.
    AttemptsExhausted,
    /// The outcome was retryable but waiting the backoff would start the next attempt after
    /// `max_elapsed_ms`.
    TimeBudgetExhausted,
    /// The server's `Retry-After` asks for a wait longer than the remaining time budget.
    RetryAfterBeyondBudget,
    /// The server answered idempo's outcome-unknown problem: an earlier attempt may have taken
    /// effect. Retrying this key cannot change the answer; reconcile before any new key.
    OutcomeUnknown,
    /// The server answered idempo's response-not-retained problem: the request was processed
    /// but its response was too large to keep. Retrying cannot return it; look the resource up.
    ResponseNotRetained,
}

impl StopReason {
    /// Stable snake_case code for this reason (used in vectors and binding errors).
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            StopReason::Success => "success",
            StopReason::Redirection => "redirection",
            StopReason::Informational => "informational",
            StopReason::KeyReusedWithDifferentRequest => "key_reused_with_different_request",
            StopReason::ClientError { .. } => "client_error",
            StopReason::ServerErrorNotRetryable { .. } => "server_error_not_retryable",
            StopReason::AttemptsExhausted => "attempts_exhausted",
            StopReason::TimeBudgetExhausted => "time_budget_exhausted",
            StopReason::RetryAfterBeyondBudget => "retry_after_beyond_budget",
            StopReason::OutcomeUnknown => "outcome_unknown",
            StopReason::ResponseNotRetained => "response_not_retained",
        }
    }
}

/// What the client should do after an attempt.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryDecision {
    /// Wait `delay_ms`, then send the same request with the same key.
    Retry {
        /// Milliseconds to wait before the next attempt.
        delay_ms: u64,
    },
    /// Do not retry.
    Stop {
        /// Why.
        reason: StopReason,
    },
}

/// An input to [`RetryPolicy::decide`] that is out of its domain.
#[derive(Debug, Clone, Copy, PartialEq, Error)]
pub enum RetryInputError {
    /// `attempt` was 0; attempts are numbered from 1 (the attempt that just finished).
    #[error("attempt numbers start at 1")]
    ZeroAttempt,
    /// The jitter sample was NaN, infinite, negative or not below 1.
    #[error("jitter must be a number in [0, 1), got {value}")]
    InvalidJitter {
        /// The sample that was given.
        value: f64,
    },
    /// The status code was outside 100..=599.
    #[error("HTTP status {status} is outside 100..=599")]
    InvalidStatus {
        /// The status that was given.
        status: u16,
    },
}

impl RetryInputError {
    /// Stable snake_case code for this error.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            RetryInputError::ZeroAttempt => "zero_attempt",
            RetryInputError::InvalidJitter { .. } => "invalid_jitter",
            RetryInputError::InvalidStatus { .. } => "invalid_status",
        }
    }
}

/// A validated retry policy. See the module docs for the algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    config: RetryConfig,
}

impl Default for RetryPolicy {
    /// The policy with [`RetryConfig::default`].
    fn default() -> Self {
        RetryPolicy {
            config: RetryConfig::default(),
        }
    }
}

impl RetryPolicy {
    /// Checks `config` and builds the policy.
    ///
    /// # Errors
    /// [`RetryConfigError`] naming the first field out of range.
    pub fn new(config: RetryConfig) -> Result<RetryPolicy, RetryConfigError> {
        if config.max_attempts == 0 {
            return Err(RetryConfigError::ZeroAttempts);
        }
        if config.base_delay_ms == 0 {
            return Err(RetryConfigError::ZeroBaseDelay);
        }
        if config.max_delay_ms > MAX_DELAY_LIMIT_MS {
            return Err(RetryConfigError::MaxDelayTooLarge {
                max_delay_ms: config.max_delay_ms,
            });
        }
        if config.base_delay_ms > config.max_delay_ms {
            return Err(RetryConfigError::BaseAboveMax {
                base_delay_ms: config.base_delay_ms,
                max_delay_ms: config.max_delay_ms,
            });
        }
        if config.max_elapsed_ms > MAX_ELAPSED_LIMIT_MS {
            return Err(RetryConfigError::MaxElapsedTooLarge {
                max_elapsed_ms: config.max_elapsed_ms,
            });
        }
        Ok(RetryPolicy { config })
    }

    /// The configuration this policy was built from.
    #[must_use]
    pub fn config(&self) -> &RetryConfig {
        &self.config
    }

    /// The backoff ceiling after attempt `attempt` (1-based): `min(max_delay, base·2^(attempt-1))`.
    #[must_use]
    pub fn backoff_cap_ms(&self, attempt: u32) -> u64 {
        let c = &self.config;
        let doubled = attempt
            .checked_sub(1)
            .and_then(|n| 1u64.checked_shl(n))
            .and_then(|factor| c.base_delay_ms.checked_mul(factor));
        doubled.map_or(c.max_delay_ms, |d| d.min(c.max_delay_ms))
    }

    /// Decides what to do after attempt number `attempt` (1-based) ended with `outcome`,
    /// `elapsed_ms` after the first attempt started, given a uniform sample `jitter` in `[0, 1)`.
    ///
    /// # Errors
    /// [`RetryInputError`] when `attempt` is 0, `jitter` is not in `[0, 1)` or a status is not
    /// in `100..=599`. Inputs are checked whatever the outcome.
    pub fn decide(
        &self,
        attempt: u32,
        elapsed_ms: u64,
        outcome: &AttemptOutcome,
        jitter: f64,
    ) -> Result<RetryDecision, RetryInputError> {
        if attempt == 0 {
            return Err(RetryInputError::ZeroAttempt);
        }
        if !(0.0..1.0).contains(&jitter) {
            return Err(RetryInputError::InvalidJitter { value: jitter });
        }
        let retry_after_ms = match *outcome {
            AttemptOutcome::Response {
                status,
                retry_after_ms,
            } => {
                if let Some(reason) = classify_status(status)? {
                    return Ok(RetryDecision::Stop { reason });
                }
                retry_after_ms
            }
            AttemptOutcome::OutcomeUnknown => {
                return Ok(RetryDecision::Stop {
                    reason: StopReason::OutcomeUnknown,
                });
            }
            AttemptOutcome::ResponseNotRetained => {
                return Ok(RetryDecision::Stop {
                    reason: StopReason::ResponseNotRetained,
                });
            }
            AttemptOutcome::KeyReused => {
                return Ok(RetryDecision::Stop {
                    reason: StopReason::KeyReusedWithDifferentRequest,
                });
            }
            AttemptOutcome::InFlight { retry_after_ms } => retry_after_ms,
            AttemptOutcome::Timeout | AttemptOutcome::ConnectionError => None,
        };
        let stop = |reason| Ok(RetryDecision::Stop { reason });
        if attempt >= self.config.max_attempts {
            return stop(StopReason::AttemptsExhausted);
        }
        let backoff = self.jittered(self.backoff_cap_ms(attempt), jitter);
        let remaining = self.config.max_elapsed_ms.saturating_sub(elapsed_ms);
        if retry_after_ms.is_some_and(|ra| ra > remaining) {
            return stop(StopReason::RetryAfterBeyondBudget);
        }
        let delay_ms = backoff.max(retry_after_ms.unwrap_or(0));
        if elapsed_ms >= self.config.max_elapsed_ms || delay_ms > remaining {
            return stop(StopReason::TimeBudgetExhausted);
        }
        Ok(RetryDecision::Retry { delay_ms })
    }

    /// Applies the jitter mode to a backoff ceiling. `jitter` is in `[0, 1)`; `cap` is at most
    /// [`MAX_DELAY_LIMIT_MS`], so the integer-to-double conversions are exact.
    fn jittered(&self, cap: u64, jitter: f64) -> u64 {
        let spread = |span: u64| -> u64 {
            // jitter·span rounds to at most span; `as` saturates and NaN cannot occur here.
            ((jitter * span as f64).floor() as u64).min(span)
        };
        match self.config.jitter {
            Jitter::Full => spread(cap),
            Jitter::Equal => {
                let half = cap / 2;
                half + spread(cap - half)
            }
        }
    }
}

/// `None` when the status is retryable, else the reason to stop.
fn classify_status(status: u16) -> Result<Option<StopReason>, RetryInputError> {
    Ok(match status {
        100..=199 => Some(StopReason::Informational),
        200..=299 => Some(StopReason::Success),
        300..=399 => Some(StopReason::Redirection),
        // 409 and 422 from the application are its answer; idempo's own are classified by
        // AttemptOutcome::from_response (InFlight, KeyReused).
        408 | 425 | 429 => None,
        400..=499 => Some(StopReason::ClientError { status }),
        501 | 505 | 506 | 508 | 510 | 511 => Some(StopReason::ServerErrorNotRetryable { status }),
        500..=599 => None,
        _ => return Err(RetryInputError::InvalidStatus { status }),
    })
}

/// Reads a `Retry-After` field value (RFC 9110 §10.2.3) as a delay in milliseconds from
/// `now_unix_ms`.
///
/// - `delay-seconds` (`1*DIGIT`): that many seconds; values above 2^31 s read as 2^31 s.
/// - An HTTP-date in any of the three RFC 9110 §5.6.7 formats (IMF-fixdate, the obsolete
///   RFC 850 and asctime forms; case-sensitive, `GMT` only, the weekday must match the date,
///   second 60 allowed): the time until that instant, 0 if it is past. A two-digit RFC 850
///   year more than 50 years ahead of `now` is read as the century before.
///
/// Surrounding spaces and tabs are ignored. Anything else (including a negative number or a
/// fraction) gives `None`: the caller then falls back to its own backoff.
#[must_use]
pub fn parse_retry_after(value: &str, now_unix_ms: u64) -> Option<u64> {
    let v = value.trim_matches([' ', '\t']);
    if v.is_empty() {
        return None;
    }
    if v.bytes().all(|b| b.is_ascii_digit()) {
        let mut secs: u64 = 0;
        for b in v.bytes() {
            secs = secs.saturating_mul(10).saturating_add(u64::from(b - b'0'));
        }
        return Some(secs.min(RETRY_AFTER_MAX_SECONDS) * 1000);
    }
    let now_secs = i64::try_from(now_unix_ms / 1000).ok()?;
    let at = parse_http_date(v.as_bytes(), now_secs)?;
    let at_ms = i128::from(at) * 1000;
    let delay = (at_ms - i128::from(now_unix_ms)).max(0);
    u64::try_from(delay).ok()
}

/// Parses an HTTP-date into unix seconds. `now_secs` resolves RFC 850 two-digit years.
#[must_use]
pub fn parse_http_date(s: &[u8], now_secs: i64) -> Option<i64> {
    const SHORT: [&[u8]; 7] = [b"Sun", b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat"];
    const LONG: [&[u8]; 7] = [
        b"Sunday",
        b"Monday",
        b"Tuesday",
        b"Wednesday",
        b"Thursday",
        b"Friday",
        b"Saturday",
    ];
    let mut c = Cursor { s, pos: 0 };
    let (weekday, year, month, day, h, m, sec);
    if let Some(wd) = LONG
        .iter()
        .position(|n| s.starts_with(n) && s.get(n.len()) == Some(&b','))
    {
        // rfc850-date: Sunday, 06-Nov-94 08:49:37 GMT
        weekday = wd;
        c.pos = LONG[wd].len();
        c.expect(b", ")?;
        day = c.digits(2)?;
        c.expect(b"-")?;
        month = c.month()?;
        c.expect(b"-")?;
        let yy = i64::from(c.digits(2)?);
        c.expect(b" ")?;
        (h, m, sec) = c.time()?;
        c.expect(b" GMT")?;
        let now_year = civil_from_days(now_secs.div_euclid(86_400)).0;
        let mut y = now_year - now_year.rem_euclid(100) + yy;
        if y > now_year + 50 {
            y -= 100;
        }
        year = y;
    } else {
        let wd = SHORT.iter().position(|n| s.starts_with(n))?;
        c.pos = 3;
        weekday = wd;
        if c.eat(b", ") {
            // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
            day = c.digits(2)?;
            c.expect(b" ")?;
            month = c.month()?;
            c.expect(b" ")?;
            year = i64::from(c.digits(4)?);
            c.expect(b" ")?;
            (h, m, sec) = c.time()?;
            c.expect(b" GMT")?;
        } else {
            // asctime-date: Sun Nov  6 08:49:37 1994
            c.expect(b" ")?;
            month = c.month()?;
            c.expect(b" ")?;
            day = if c.eat(b" ") {
                c.digits(1)?
            } else {
                c.digits(2)?
            };
            c.expect(b" ")?;
            (h, m, sec) = c.time()?;
            c.expect(b" ")?;
            year = i64::from(c.digits(4)?);
        }
    }
    if c.pos != s.len() {
        return None;
    }
    if day == 0 || day > days_in_month(year, month) || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    if usize::try_from((days + 4).rem_euclid(7)).ok()? != weekday {
        return None;
    }
    Some(days * 86_400 + i64::from(h) * 3600 + i64::from(m) * 60 + i64::from(sec))
}

struct Cursor<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn eat(&mut self, lit: &[u8]) -> bool {
        if self.s[self.pos..].starts_with(lit) {
            self.pos += lit.len();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, lit: &[u8]) -> Option<()> {
        self.eat(lit).then_some(())
    }

    fn digits(&mut self, n: usize) -> Option<u32> {
        let d = self.s.get(self.pos..self.pos + n)?;
        if !d.iter().all(u8::is_ascii_digit) {
            return None;
        }
        self.pos += n;
        Some(d.iter().fold(0u32, |acc, b| acc * 10 + u32::from(b - b'0')))
    }

    fn month(&mut self) -> Option<u32> {
        const MONTHS: [&[u8]; 12] = [
            b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
            b"Dec",
        ];
        let i = MONTHS
            .iter()
            .position(|m| self.s[self.pos..].starts_with(m))?;
        self.pos += 3;
        u32::try_from(i + 1).ok()
    }

    fn time(&mut self) -> Option<(u32, u32, u32)> {
        let h = self.digits(2)?;
        self.expect(b":")?;
        let m = self.digits(2)?;
        self.expect(b":")?;
        let s = self.digits(2)?;
        Some((h, m, s))
    }
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if is_leap(y) => 29,
        _ => 28,
    }
}

/// Days from 1970-01-01 to the proleptic Gregorian date (y, m, d), using 400-year eras
/// (146,097 days) and a March-based year so that the leap day falls at the end.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // 0..=399
    let mp = i64::from((m + 9) % 12); // March = 0
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1; // 0..=365
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // 0..=146096
    era * 146_097 + doe - 719_468 // 719,468 days from 0000-03-01 to 1970-01-01
}

/// The inverse of [`days_from_civil`]: (year, month, day) of a day count from 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(status: u16, retry_after_ms: Option<u64>) -> AttemptOutcome {
        AttemptOutcome::Response {
            status,
            retry_after_ms,
        }
    }

    #[test]
    fn classification() {
        let p = RetryPolicy::default();
        let d = |o: AttemptOutcome| p.decide(1, 0, &o, 0.5).unwrap();
        assert_eq!(
            d(resp(201, None)),
            RetryDecision::Stop {
                reason: StopReason::Success
            }
        );
        assert_eq!(
            d(resp(302, None)),
            RetryDecision::Stop {
                reason: StopReason::Redirection
            }
        );
        assert_eq!(
            d(AttemptOutcome::KeyReused),
            RetryDecision::Stop {
                reason: StopReason::KeyReusedWithDifferentRequest
            }
        );
        // The application's own 409 and 422 are its answer: stopped, never "key reused".
        for s in [409, 422] {
            assert_eq!(
                d(resp(s, Some(1000))),
                RetryDecision::Stop {
                    reason: StopReason::ClientError { status: s }
                }
            );
        }
        assert_eq!(
            d(AttemptOutcome::ResponseNotRetained),
            RetryDecision::Stop {
                reason: StopReason::ResponseNotRetained
            }
        );
        assert!(matches!(
            d(AttemptOutcome::InFlight {
                retry_after_ms: None
            }),
            RetryDecision::Retry { .. }
        ));
        assert_eq!(
            d(resp(400, None)),
            RetryDecision::Stop {
                reason: StopReason::ClientError { status: 400 }
            }
        );
        assert_eq!(
            d(resp(501, None)),
            RetryDecision::Stop {
                reason: StopReason::ServerErrorNotRetryable { status: 501 }
            }
        );
        for s in [408, 425, 429, 500, 502, 503, 504, 599] {
            assert!(
                matches!(d(resp(s, None)), RetryDecision::Retry { .. }),
                "{s}"
            );
        }
        assert!(matches!(
            d(AttemptOutcome::Timeout),
            RetryDecision::Retry { .. }
        ));
        assert!(matches!(
            d(AttemptOutcome::ConnectionError),
            RetryDecision::Retry { .. }
        ));
    }

    const OU_BODY: &str =
        r#"{"type":"urn:idempo:problem:outcome-unknown","title":"Outcome unknown","status":500}"#;
    const PJ: Option<&str> = Some("application/problem+json");

    #[test]
    fn from_response_tells_idempo_problems_from_the_applications_answers() {
        use crate::machine::problem::{ProblemKind, problem_response};
        let server = |kind: ProblemKind| {
            let r = problem_response(kind, None, None, Some(2_000));
            let ct = r
                .headers
                .iter()
                .find(|(n, _)| n == "content-type")
                .map(|(_, v)| v.clone());
            AttemptOutcome::from_response(r.status, Some(2_000), ct.as_deref(), &r.body)
        };
        assert_eq!(server(ProblemKind::Mismatch), AttemptOutcome::KeyReused);
        assert_eq!(
            server(ProblemKind::InFlight),
            AttemptOutcome::InFlight {
                retry_after_ms: Some(2_000)
            }
        );
        assert_eq!(
            server(ProblemKind::ResponseNotRetained),
            AttemptOutcome::ResponseNotRetained
        );
        let app422 = br#"{"detail":[{"loc":["body","amount"],"msg":"field required"}]}"#;
        for (status, ct, body) in [
            (422, Some("application/json"), &app422[..]),
            (422, PJ, br#"{"type":"https://example.com/validation"}"#),
            (422, PJ, br#"{"type":"urn:idempo:problem:in-flight"}"#),
            (
                409,
                Some("application/json"),
                br#"{"error":"already paid"}"#,
            ),
            (409, PJ, br#"{"type":"urn:idempo:problem:key-reused"}"#),
            (500, PJ, br#"{"type":"urn:idempo:problem:key-reused"}"#),
            (
                201,
                PJ,
                br#"{"type":"urn:idempo:problem:response-not-retained"}"#,
            ),
        ] {
            assert_eq!(
                AttemptOutcome::from_response(status, None, ct, body),
                resp(status, None),
                "{status} {ct:?}"
            );
        }
        assert!(AttemptOutcome::body_needed(422, PJ));
        assert!(AttemptOutcome::body_needed(409, PJ));
        assert!(!AttemptOutcome::body_needed(422, Some("application/json")));
        assert!(!AttemptOutcome::body_needed(201, PJ));
    }

    #[test]
    fn from_response_recognises_the_outcome_unknown_problem() {
        let ou = AttemptOutcome::OutcomeUnknown;
        let plain = resp(500, Some(1000));
        let f = |ct: Option<&str>, body: &str| {
            AttemptOutcome::from_response(500, Some(1000), ct, body.as_bytes())
        };
        assert_eq!(f(PJ, OU_BODY), ou);
        // The server's own answer is recognised.
        let r = crate::machine::problem::problem_response(
            crate::machine::problem::ProblemKind::OutcomeUnknown,
            None,
            None,
            None,
        );
        let ct = r
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
            .map(|(_, v)| v.as_str());
        assert_eq!(
            AttemptOutcome::from_response(r.status, None, ct, &r.body),
            ou
        );
        // Media type parameters, case, whitespace, member order and escapes do not matter.
        assert_eq!(
            f(Some(" Application/Problem+JSON ; charset=utf-8"), OU_BODY),
            ou
        );
        assert_eq!(
            f(
                PJ,
                "\n{ \"status\" : 500,\n  \"t\\u0079pe\" :\t\"urn:idempo:problem:outcome\\u002dunknown\" }"
            ),
            ou
        );
        assert_eq!(
            f(
                PJ,
                r#"{"a":[1,{"type":"x"}],"detail":"a \"type\":","type":"urn:idempo:problem:outcome-unknown"}"#
            ),
            ou
        );
        // Anything else is an ordinary response.
        for (ct, body) in [
            (None, OU_BODY),
            (Some("application/json"), OU_BODY),
            (Some("application/problem+json2"), OU_BODY),
            (PJ, r#"{"type":"urn:idempo:problem:store-unavailable"}"#),
            (PJ, r#"{"type":"urn:idempo:problem:outcome-unknownx"}"#),
            (PJ, r#"{"type":"URN:idempo:problem:outcome-unknown"}"#),
            (
                PJ,
                r#"{"inner":{"type":"urn:idempo:problem:outcome-unknown"}}"#,
            ),
            (PJ, r#"[{"type":"urn:idempo:problem:outcome-unknown"}]"#),
            (
                PJ,
                r#"{"detail":"\"type\":\"urn:idempo:problem:outcome-unknown\""}"#,
            ),
            (PJ, r#"{"type":["urn:idempo:problem:outcome-unknown"]}"#),
            (PJ, r#""urn:idempo:problem:outcome-unknown""#),
            (
                PJ,
                r#"{"type":"urn:idempo:problem:outcome-unknown","type":"x"}"#,
            ),
            (PJ, r#"{"type":"urn:idempo:problem:outcome-unknown""#),
            (PJ, ""),
        ] {
            assert_eq!(f(ct, body), plain, "{ct:?} {body}");
        }
        // Only a 500 carries it.
        assert_eq!(
            AttemptOutcome::from_response(503, None, PJ, OU_BODY.as_bytes()),
            resp(503, None)
        );
        assert!(!AttemptOutcome::body_needed(503, PJ));
        assert!(!AttemptOutcome::body_needed(500, None));
        assert!(AttemptOutcome::body_needed(500, PJ));
        // The body is bounded.
        let padded = format!(
            r#"{{"type":"urn:idempo:problem:outcome-unknown","pad":"{}"}}"#,
            "x".repeat(OUTCOME_UNKNOWN_BODY_LIMIT)
        );
        assert_eq!(f(PJ, &padded), plain);
        let fits = format!(
            r#"{{"type":"urn:idempo:problem:outcome-unknown","pad":"{}"}}"#,
            "x".repeat(OUTCOME_UNKNOWN_BODY_LIMIT - 60)
        );
        assert_eq!(f(PJ, &fits), ou);
    }

    #[test]
    fn outcome_unknown_stops_at_once() {
        let p = RetryPolicy::default();
        let stop = Ok(RetryDecision::Stop {
            reason: StopReason::OutcomeUnknown,
        });
        assert_eq!(p.decide(1, 0, &AttemptOutcome::OutcomeUnknown, 0.5), stop);
        // Final even when the budget is gone, and inputs are still validated.
        assert_eq!(
            p.decide(9, 999_999, &AttemptOutcome::OutcomeUnknown, 0.0),
            stop
        );
        assert_eq!(
            p.decide(0, 0, &AttemptOutcome::OutcomeUnknown, 0.5),
            Err(RetryInputError::ZeroAttempt)
        );
        assert_eq!(StopReason::OutcomeUnknown.code(), "outcome_unknown");
    }

    #[test]
    fn equal_jitter_backoff_and_bounds() {
        let p = RetryPolicy::default();
        let o = AttemptOutcome::Timeout;
        // attempt 1: cap 500 -> [250, 500]
        assert_eq!(
            p.decide(1, 0, &o, 0.0),
            Ok(RetryDecision::Retry { delay_ms: 250 })
        );
        assert_eq!(
            p.decide(1, 0, &o, 0.5),
            Ok(RetryDecision::Retry { delay_ms: 375 })
        );
        // attempt 4: cap 4000
        assert_eq!(
            p.decide(4, 0, &o, 0.999),
            Ok(RetryDecision::Retry { delay_ms: 3998 })
        );
        assert_eq!(
            p.decide(5, 0, &o, 0.1),
            Ok(RetryDecision::Stop {
                reason: StopReason::AttemptsExhausted
            })
        );
        assert_eq!(p.backoff_cap_ms(7), 10_000);
        assert_eq!(p.backoff_cap_ms(200), 10_000);
        assert_eq!(
            p.decide(2, 59_800, &o, 0.0),
            Ok(RetryDecision::Stop {
                reason: StopReason::TimeBudgetExhausted
            })
        );
    }

    #[test]
    fn retry_after_is_a_floor_bounded_by_budget() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.decide(
                1,
                0,
                &AttemptOutcome::InFlight {
                    retry_after_ms: Some(2000)
                },
                0.0
            ),
            Ok(RetryDecision::Retry { delay_ms: 2000 })
        );
        assert_eq!(
            p.decide(1, 0, &resp(503, Some(100)), 0.0),
            Ok(RetryDecision::Retry { delay_ms: 250 })
        );
        assert_eq!(
            p.decide(1, 0, &resp(429, Some(30_000)), 0.0),
            Ok(RetryDecision::Retry { delay_ms: 30_000 })
        );
        assert_eq!(
            p.decide(1, 40_000, &resp(429, Some(30_000)), 0.0),
            Ok(RetryDecision::Stop {
                reason: StopReason::RetryAfterBeyondBudget
            })
        );
    }

    #[test]
    fn invalid_inputs_are_errors() {
        let p = RetryPolicy::default();
        let o = AttemptOutcome::Timeout;
        for j in [f64::NAN, -0.1, 1.0, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(p.decide(1, 0, &o, j).unwrap_err().code(), "invalid_jitter");
        }
        assert_eq!(
            p.decide(1, 0, &o, -0.0),
            Ok(RetryDecision::Retry { delay_ms: 250 })
        );
        assert_eq!(p.decide(0, 0, &o, 0.5), Err(RetryInputError::ZeroAttempt));
        assert_eq!(
            p.decide(1, 0, &resp(99, None), 0.5),
            Err(RetryInputError::InvalidStatus { status: 99 })
        );
        assert_eq!(
            p.decide(1, 0, &resp(600, None), 0.5),
            Err(RetryInputError::InvalidStatus { status: 600 })
        );
    }

    #[test]
    fn config_validation() {
        let base = RetryConfig::default();
        assert_eq!(
            RetryPolicy::new(RetryConfig {
                max_attempts: 0,
                ..base
            }),
            Err(RetryConfigError::ZeroAttempts)
        );
        assert_eq!(
            RetryPolicy::new(RetryConfig {
                base_delay_ms: 0,
                ..base
            }),
            Err(RetryConfigError::ZeroBaseDelay)
        );
        assert_eq!(
            RetryPolicy::new(RetryConfig {
                base_delay_ms: 20_000,
                ..base
            })
            .unwrap_err()
            .code(),
            "base_above_max"
        );
        assert_eq!(
            RetryPolicy::new(RetryConfig {
                max_delay_ms: MAX_DELAY_LIMIT_MS + 1,
                ..base
            })
            .unwrap_err()
            .code(),
            "max_delay_too_large"
        );
        assert_eq!(
            RetryPolicy::new(RetryConfig {
                max_elapsed_ms: MAX_ELAPSED_LIMIT_MS + 1,
                ..base
            })
            .unwrap_err()
            .code(),
            "max_elapsed_too_large"
        );
        assert!(RetryPolicy::new(base).is_ok());
    }

    #[test]
    fn http_dates() {
        // 1994-11-06T08:49:37Z = 784111777
        let now = 784_111_777_000 - 5_000;
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(5_000)
        );
        assert_eq!(
            parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now),
            Some(5_000)
        );
        assert_eq!(
            parse_retry_after("Sun Nov  6 08:49:37 1994", now),
            Some(5_000)
        );
        assert_eq!(
            parse_retry_after("Mon, 06 Nov 1994 08:49:37 GMT", now),
            None,
            "wrong weekday"
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 UTC", now),
            None
        );
        assert_eq!(
            parse_retry_after("sun, 06 nov 1994 08:49:37 GMT", now),
            None
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now + 10_000),
            Some(0)
        );
        assert_eq!(parse_retry_after(" 120 ", now), Some(120_000));
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(RETRY_AFTER_MAX_SECONDS * 1000)
        );
        assert_eq!(parse_retry_after("-1", now), None);
        assert_eq!(parse_retry_after("1.5", now), None);
        assert_eq!(parse_retry_after("", now), None);
    }

    #[test]
    fn civil_round_trip() {
        for z in [-800_000i64, -1, 0, 1, 59, 365, 10_957, 11_016, 2_932_896] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z, "{z}");
        }
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1970, 1, 1), 0);
    }
}
