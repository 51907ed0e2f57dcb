//! The key state machine.
//!
//! - [`decide`]: what a request does with the record it found (the claim-lost path), a pure
//!   function of the record, the request's fingerprint, the store's `now` and the route's
//!   [`Config`].
//! - [`store`]: the storage primitives as pure transitions on an `Option<Record>`: the normative
//!   reference every adapter (and the model checker and the in-memory stores) must match.
//! - [`ServerFlow`]: the sans-IO server flow. The host feeds [`Event`]s (store results, handler
//!   results, heartbeat timers) and executes the [`Action`]s it gets back (store operations,
//!   "run the handler", "respond").
//! - [`memory`]: the bounded in-memory store (capacity, eviction, per-partition quotas) every
//!   binding wraps.
//! - [`cache`]: the cache rule: when a cached record may be served and how long a fill lives.
//! - [`problem`]: RFC 9457 problem+json responses for every non-handler answer.
//! - [`admit`](mod@admit): admission before the flow (key, body size, fingerprint, scope), in the order of
//!   `spec/PROTOCOL.md` §7.2.
//!
//! The normative description is `spec/PROTOCOL.md`.
pub mod admit;
pub mod cache;
pub mod capture;
mod cleanup;
mod flow;
mod io;
pub mod memory;
pub mod problem;
pub mod store;

pub use admit::{
    Admitted, AwaitingBody, AwaitingScope, BodyRead, BodyStage, FingerprintFailed, KeyStage,
    MissingKey, Refusal, ScopeResolution, ScopeRule, ScopeRuleError, ScopeStage, admit,
    missing_key,
};
pub use capture::{BodyCapture, CapturePlan, CaptureStep, capture_plan, not_retained_response};

pub use cleanup::{CLEANUP_FIRST_DELAY_MS, CLEANUP_MAX_DELAY_MS, Cleanup, CleanupStep};
pub use flow::{FlowError, ServerFlow};
pub use io::{
    Action, DownstreamKey, Event, HandlerResponse, HttpResponse, Outcome, REPLAYED_HEADER,
    RunHandler, StoreOp, StoreResult, downstream_key, replay_response,
};

use crate::policy::{Config, TakeoverPolicy};
use crate::record::{FencingToken, FingerprintText, Record, RecordState, StoredResponse};

/// What to do with an existing record (see [`decide`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum Decision<'r> {
    /// The record has expired: it counts as absent; claim again.
    Absent,
    /// Completed with the same fingerprint: answer with the stored response (the handler does
    /// not run).
    Replay(&'r StoredResponse),
    /// In progress with a live lease: answer 409 at once with this `Retry-After` hint (ms, ≥ 1).
    InFlight {
        /// Suggested wait, the smaller of the lease left and the configured hint.
        retry_after_ms: u64,
    },
    /// The record belongs to another request (different fingerprint): answer 422.
    Mismatch,
    /// In progress, lease expired, policy re-run: take the key over (compare-and-set on
    /// `seen_token`) and run the handler.
    TakeOver {
        /// The token to compare against.
        seen_token: FencingToken,
    },
    /// In progress, lease expired, policy outcome-unknown: mark the record outcome-unknown
    /// (compare-and-set on `seen_token`) and answer with the outcome-unknown problem.
    MarkUnknown {
        /// The token to compare against.
        seen_token: FencingToken,
    },
    /// The record is in the terminal outcome-unknown state: answer with the outcome-unknown
    /// problem.
    OutcomeUnknown,
}

/// Decides what a request with fingerprint `request_fp` does with the record `existing`, read from
/// the store at the store's time `now_ms`.
///
/// Order of checks (normative, `spec/PROTOCOL.md` §5):
/// 1. `expires_at <= now`: [`Decision::Absent`].
/// 2. another fingerprint: [`Decision::Mismatch`], whatever the state.
/// 3. by state: completed → [`Decision::Replay`]; outcome-unknown → [`Decision::OutcomeUnknown`];
///    in progress with `lease_until > now` → [`Decision::InFlight`]; in progress with an expired
///    lease → [`Decision::TakeOver`] or [`Decision::MarkUnknown`] per [`TakeoverPolicy`]. An
///    expired lease is never answered 409.
pub fn decide<'r>(
    existing: &'r Record,
    request_fp: &FingerprintText,
    now_ms: u64,
    config: &Config,
) -> Decision<'r> {
    if existing.is_expired(now_ms) {
        return Decision::Absent;
    }
    if !existing.fingerprint.matches(request_fp) {
        return Decision::Mismatch;
    }
    match &existing.state {
        RecordState::Completed { response } => Decision::Replay(response),
        RecordState::OutcomeUnknown => Decision::OutcomeUnknown,
        RecordState::InProgress { lease_until_ms } if *lease_until_ms > now_ms => {
            Decision::InFlight {
                retry_after_ms: (*lease_until_ms - now_ms)
                    .min(config.in_flight_retry_after_ms.get()),
            }
        }
        RecordState::InProgress { .. } => match config.takeover {
            TakeoverPolicy::ReRun => Decision::TakeOver {
                seen_token: existing.token,
            },
            TakeoverPolicy::OutcomeUnknown => Decision::MarkUnknown {
                seen_token: existing.token,
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Config;

    fn fp(s: &str) -> FingerprintText {
        FingerprintText::new(s).expect("valid")
    }

    fn rec(state: RecordState) -> Record {
        Record {
            fingerprint: fp("v1:aa"),
            generation: 1,
            token: FencingToken([1; 16]),
            expires_at_ms: 10_000,
            state,
        }
    }

    fn resp() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![],
            body: b"{}".to_vec(),
        }
    }

    fn rerun() -> Config {
        Config {
            takeover: TakeoverPolicy::ReRun,
            ..Config::default()
        }
    }

    #[test]
    fn completed_same_fingerprint_replays() {
        let r = rec(RecordState::Completed { response: resp() });
        assert_eq!(
            decide(&r, &fp("v1:aa"), 5_000, &Config::default()),
            Decision::Replay(&resp())
        );
    }

    #[test]
    fn mismatch_in_every_state() {
        for state in [
            RecordState::InProgress {
                lease_until_ms: 9_000,
            },
            RecordState::InProgress {
                lease_until_ms: 1_000,
            },
            RecordState::Completed { response: resp() },
            RecordState::OutcomeUnknown,
        ] {
            let r = rec(state);
            for cfg in [Config::default(), rerun()] {
                assert_eq!(
                    decide(&r, &fp("v1:bb"), 5_000, &cfg),
                    Decision::Mismatch,
                    "{r:?}"
                );
            }
        }
    }

    #[test]
    fn live_lease_is_in_flight_with_bounded_hint() {
        let r = rec(RecordState::InProgress {
            lease_until_ms: 9_000,
        });
        assert_eq!(
            decide(&r, &fp("v1:aa"), 5_000, &Config::default()),
            Decision::InFlight {
                retry_after_ms: 1_000
            }
        );
        assert_eq!(
            decide(&r, &fp("v1:aa"), 8_700, &Config::default()),
            Decision::InFlight {
                retry_after_ms: 300
            }
        );
        assert_eq!(
            decide(&r, &fp("v1:aa"), 8_999, &Config::default()),
            Decision::InFlight { retry_after_ms: 1 }
        );
    }

    #[test]
    fn expired_lease_is_never_in_flight() {
        let r = rec(RecordState::InProgress {
            lease_until_ms: 5_000,
        });
        // lease_until == now already counts as expired
        for now in [5_000, 5_001, 9_999] {
            assert_eq!(
                decide(&r, &fp("v1:aa"), now, &rerun()),
                Decision::TakeOver {
                    seen_token: FencingToken([1; 16])
                }
            );
            assert_eq!(
                decide(&r, &fp("v1:aa"), now, &Config::default()),
                Decision::MarkUnknown {
                    seen_token: FencingToken([1; 16])
                }
            );
        }
    }

    #[test]
    fn outcome_unknown_is_terminal() {
        let r = rec(RecordState::OutcomeUnknown);
        for cfg in [Config::default(), rerun()] {
            assert_eq!(
                decide(&r, &fp("v1:aa"), 5_000, &cfg),
                Decision::OutcomeUnknown
            );
        }
    }

    #[test]
    fn expired_record_is_absent_whatever_its_state_or_fingerprint() {
        for state in [
            RecordState::InProgress {
                lease_until_ms: 10_000,
            },
            RecordState::Completed { response: resp() },
            RecordState::OutcomeUnknown,
        ] {
            let r = rec(state);
            for f in ["v1:aa", "v1:bb"] {
                assert_eq!(
                    decide(&r, &fp(f), 10_000, &Config::default()),
                    Decision::Absent
                );
                assert_eq!(
                    decide(&r, &fp(f), u64::MAX, &Config::default()),
                    Decision::Absent
                );
            }
        }
    }
}
