//! The client retry policy (core decides; the JS client only sleeps and re-sends).
use idempo_core::retry::{self, AttemptOutcome, Jitter, RetryConfig, RetryDecision, StopReason};
use idempo_core::vocab::{AttemptKind, ParseNameError};
use napi::Env;
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

use crate::error::{Fail, code};
use crate::num::{from_u64, to_status, to_u64};

/// Retry policy settings; omitted fields take core's defaults.
#[napi(object)]
#[derive(Default)]
pub struct RetryPolicyOptions {
    /// Maximum number of attempts, the first included (default 5).
    pub max_attempts: Option<u32>,
    /// Backoff base in ms (default 500).
    pub base_delay_ms: Option<f64>,
    /// Backoff ceiling in ms (default 10000).
    pub max_delay_ms: Option<f64>,
    /// Total time budget in ms since the first attempt started (default 60000).
    pub max_elapsed_ms: Option<f64>,
    /// `"equal"` (default) or `"full"` jitter.
    pub jitter: Option<String>,
}

/// How an attempt ended.
#[napi(object)]
pub struct AttemptOutcomeInput {
    /// `"response"`, `"timeout"`, `"connection_error"`, `"outcome_unknown"`, `"key_reused"`,
    /// `"in_flight"` or `"response_not_retained"` (the last three are idempo's own problems;
    /// a `"response"` with a content type and body is classified by core).
    pub kind: String,
    /// HTTP status (for `"response"`).
    pub status: Option<u32>,
    /// The parsed `Retry-After` in ms (for `"response"`), if the response had a valid one.
    pub retry_after_ms: Option<f64>,
    /// The response's `Content-Type` (for `"response"`): with `body`, lets core recognise
    /// idempo's outcome-unknown problem.
    pub content_type: Option<String>,
    /// The response body (for `"response"`), read only when `responseBodyNeeded` says so.
    pub body: Option<Buffer>,
}

/// Core's decision.
#[napi(object)]
pub struct RetryDecisionOutput {
    /// True: retry with the same key after `delayMs`.
    pub retry: bool,
    /// Delay before the next attempt (when `retry`).
    pub delay_ms: Option<f64>,
    /// Why to stop (when not `retry`): core's snake_case stop reason.
    pub reason: Option<String>,
    /// The status behind a `client_error` or `server_error_not_retryable` stop.
    pub status: Option<u32>,
    /// Whether the stop settles a pending intent (its record is removed) or leaves the key
    /// pending (core's `StopReason::settles_intent`); false for a retry.
    pub settles_intent: bool,
}

fn config(o: &RetryPolicyOptions) -> Result<RetryConfig, Fail> {
    let d = RetryConfig::default();
    let jitter = match o.jitter.as_deref() {
        None => d.jitter,
        Some(name) => name
            .parse::<Jitter>()
            .map_err(|e| Fail::new(code::CONFIG, e.to_string()))?,
    };
    let opt = |v: Option<f64>, name: &str, default: u64| v.map_or(Ok(default), |x| to_u64(x, name));
    Ok(RetryConfig {
        max_attempts: o.max_attempts.unwrap_or(d.max_attempts),
        base_delay_ms: opt(o.base_delay_ms, "baseDelayMs", d.base_delay_ms)?,
        max_delay_ms: opt(o.max_delay_ms, "maxDelayMs", d.max_delay_ms)?,
        max_elapsed_ms: opt(o.max_elapsed_ms, "maxElapsedMs", d.max_elapsed_ms)?,
        jitter,
    })
}

fn outcome(o: &AttemptOutcomeInput) -> Result<AttemptOutcome, Fail> {
    // Core's vocabulary names the kinds; a `response` is classified from the response itself.
    let kind: AttemptKind = o
        .kind
        .parse()
        .map_err(|e: ParseNameError| Fail::new(code::INVALID_ARGUMENT, e.to_string()))?;
    let retry_after_ms = o
        .retry_after_ms
        .map(|v| to_u64(v, "retryAfterMs"))
        .transpose()?;
    if let Some(outcome) = kind.outcome(retry_after_ms) {
        return Ok(outcome);
    }
    let status = o
        .status
        .ok_or_else(|| Fail::new(code::INVALID_ARGUMENT, "a response outcome needs a status"))?;
    Ok(AttemptOutcome::from_response(
        to_status(status)?,
        retry_after_ms,
        o.content_type.as_deref(),
        o.body.as_deref().unwrap_or(&[]),
    ))
}

/// The retry policy of core, configured once and asked after every attempt.
#[napi]
pub struct RetryPolicy {
    inner: retry::RetryPolicy,
}

#[napi]
impl RetryPolicy {
    /// Validates the settings (throws `CONFIG_INVALID` with core's reason code).
    #[napi(constructor, catch_unwind)]
    pub fn new(env: Env, options: Option<RetryPolicyOptions>) -> napi::Result<Self> {
        let cfg = config(&options.unwrap_or_default()).map_err(|f| f.throw(&env))?;
        let inner = retry::RetryPolicy::new(cfg).map_err(|e| {
            Fail::new(code::CONFIG, e.to_string())
                .reason(e.code())
                .throw(&env)
        })?;
        Ok(Self { inner })
    }

    /// What to do after attempt `attempt` (1-based) ended with `outcome`, `elapsedMs` after the
    /// first attempt started; `jitter` is a uniform sample in [0, 1) from the host.
    #[napi(catch_unwind)]
    pub fn decide(
        &self,
        env: Env,
        attempt: u32,
        elapsed_ms: f64,
        outcome: AttemptOutcomeInput,
        jitter: f64,
    ) -> napi::Result<RetryDecisionOutput> {
        let elapsed = to_u64(elapsed_ms, "elapsedMs").map_err(|f| f.throw(&env))?;
        let o = self::outcome(&outcome).map_err(|f| f.throw(&env))?;
        let d = self
            .inner
            .decide(attempt, elapsed, &o, jitter)
            .map_err(|e| {
                Fail::new(code::INVALID_ARGUMENT, e.to_string())
                    .reason(e.code())
                    .throw(&env)
            })?;
        Ok(match d {
            RetryDecision::Retry { delay_ms } => RetryDecisionOutput {
                retry: true,
                delay_ms: Some(from_u64(delay_ms)),
                reason: None,
                status: None,
                settles_intent: false,
            },
            RetryDecision::Stop { reason } => RetryDecisionOutput {
                retry: false,
                delay_ms: None,
                reason: Some(reason.code().to_owned()),
                status: match reason {
                    StopReason::ClientError { status }
                    | StopReason::ServerErrorNotRetryable { status } => Some(u32::from(status)),
                    _ => None,
                },
                settles_intent: reason.settles_intent(),
            },
        })
    }
}

/// Whether core looks at the body of a response with this status and `Content-Type` to
/// recognise idempo's own problems (a 409, 422 or 500 `application/problem+json`).
#[napi(catch_unwind)]
pub fn response_body_needed(status: u32, content_type: Option<String>) -> bool {
    u16::try_from(status).is_ok_and(|s| AttemptOutcome::body_needed(s, content_type.as_deref()))
}

/// Parses a `Retry-After` value (delay-seconds or HTTP-date) into ms from `nowMs`; `null` when
/// the value is not valid.
#[napi(catch_unwind)]
pub fn parse_retry_after(env: Env, value: String, now_ms: f64) -> napi::Result<Option<f64>> {
    let now = to_u64(now_ms, "nowMs").map_err(|f| f.throw(&env))?;
    Ok(retry::parse_retry_after(&value, now).map(from_u64))
}
