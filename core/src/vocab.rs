//! One vocabulary: the stable names of core's enumerations, parsed and printed in one place.
//!
//! Every binding parses user-facing option strings through these [`FromStr`] implementations
//! and prints them with `as_str` (or [`Display`](fmt::Display)), so a name means the same in
//! Python, Node and Swift and a wrong one is refused with the same message, which lists the
//! accepted values.
use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::canonical::NumberMode;
use crate::machine::StoreOp;
use crate::policy::TakeoverPolicy;
use crate::retry::{AttemptOutcome, Jitter};

/// A name that is not one of an enumeration's accepted values.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{what} must be one of {}, got {got:?}{}", quoted(accepted), hint.map(|h| format!(" ({h})")).unwrap_or_default())]
pub struct ParseNameError {
    /// What was being parsed (`"takeover"`, `"numbers"`, `"jitter"`, ...).
    pub what: &'static str,
    /// The text given.
    pub got: String,
    /// Every accepted value.
    pub accepted: &'static [&'static str],
    /// A hint for a value that used to be accepted (e.g. a renamed value).
    pub hint: Option<&'static str>,
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

impl ParseNameError {
    /// Stable snake_case code: `invalid_<what>`.
    #[must_use]
    pub fn code(&self) -> String {
        format!("invalid_{}", self.what)
    }
}

macro_rules! names {
    ($ty:ty, $what:literal, $all:ident, [$($variant:path => $name:literal),+ $(,)?], $hint:expr) => {
        /// Every accepted name, in declaration order.
        const $all: &[&str] = &[$($name),+];

        impl $ty {
            /// The stable snake_case name (the inverse of [`FromStr`]).
            #[must_use]
            pub fn as_str(&self) -> &'static str {
                match self {
                    $($variant => $name),+
                }
            }

            /// Every accepted name.
            #[must_use]
            pub fn names() -> &'static [&'static str] {
                $all
            }
        }

        impl FromStr for $ty {
            type Err = ParseNameError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($name => Ok($variant),)+
                    other => {
                        let hint: fn(&str) -> Option<&'static str> = $hint;
                        Err(ParseNameError {
                            what: $what,
                            got: other.to_owned(),
                            accepted: $all,
                            hint: hint(other),
                        })
                    }
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

names!(
    TakeoverPolicy,
    "takeover",
    TAKEOVER_NAMES,
    [
        TakeoverPolicy::OutcomeUnknown => "outcome_unknown",
        TakeoverPolicy::ReRun => "re_run",
    ],
    |_| None
);

names!(
    NumberMode,
    "numbers",
    NUMBER_MODE_NAMES,
    [
        NumberMode::RejectPrecisionLoss => "reject_precision_loss",
        NumberMode::Rfc => "rfc",
    ],
    // One name per mode: the Python binding's former alias is refused with its new name.
    |s| (s == "strict").then_some("\"strict\" is now \"reject_precision_loss\"")
);

names!(
    Jitter,
    "jitter",
    JITTER_NAMES,
    [Jitter::Equal => "equal", Jitter::Full => "full"],
    |_| None
);

/// The kind of one client attempt's result, as bindings name it when they report it to
/// [`RetryPolicy::decide`](crate::retry::RetryPolicy::decide).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptKind {
    /// A response arrived (the binding supplies status, `Retry-After`, content type, body).
    Response,
    /// No response within the client's timeout.
    Timeout,
    /// The connection failed or broke.
    ConnectionError,
    /// The server answered with idempo's outcome-unknown problem.
    OutcomeUnknown,
    /// The server answered with idempo's key-reused problem (422).
    KeyReused,
    /// The server answered with idempo's in-flight problem (409).
    InFlight,
    /// The server answered with idempo's response-not-retained problem (500).
    ResponseNotRetained,
}

names!(
    AttemptKind,
    "attempt_kind",
    ATTEMPT_KIND_NAMES,
    [
        AttemptKind::Response => "response",
        AttemptKind::Timeout => "timeout",
        AttemptKind::ConnectionError => "connection_error",
        AttemptKind::OutcomeUnknown => "outcome_unknown",
        AttemptKind::KeyReused => "key_reused",
        AttemptKind::InFlight => "in_flight",
        AttemptKind::ResponseNotRetained => "response_not_retained",
    ],
    |_| None
);

impl AttemptKind {
    /// The attempt's outcome for every kind but [`AttemptKind::Response`], whose outcome comes
    /// from the response itself ([`AttemptOutcome::from_response`]); `retry_after_ms` is the
    /// answer's `Retry-After` (kept by [`AttemptKind::InFlight`] only). `None` for `Response`.
    #[must_use]
    pub fn outcome(self, retry_after_ms: Option<u64>) -> Option<AttemptOutcome> {
        match self {
            AttemptKind::Response => None,
            AttemptKind::Timeout => Some(AttemptOutcome::Timeout),
            AttemptKind::ConnectionError => Some(AttemptOutcome::ConnectionError),
            AttemptKind::OutcomeUnknown => Some(AttemptOutcome::OutcomeUnknown),
            AttemptKind::KeyReused => Some(AttemptOutcome::KeyReused),
            AttemptKind::InFlight => Some(AttemptOutcome::InFlight { retry_after_ms }),
            AttemptKind::ResponseNotRetained => Some(AttemptOutcome::ResponseNotRetained),
        }
    }
}

impl StoreOp {
    /// The storage primitive's stable name (`claim`, `get`, `takeover`, `mark_unknown`,
    /// `complete`, `release`, `renew`, `commit`), as store adapters and metrics name it.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            StoreOp::Claim { .. } => "claim",
            StoreOp::Get { .. } => "get",
            StoreOp::TakeOver { .. } => "takeover",
            StoreOp::MarkUnknown { .. } => "mark_unknown",
            StoreOp::Complete { .. } => "complete",
            StoreOp::Release { .. } => "release",
            StoreOp::Renew { .. } => "renew",
            StoreOp::Commit { .. } => "commit",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in [TakeoverPolicy::OutcomeUnknown, TakeoverPolicy::ReRun] {
            assert_eq!(p.as_str().parse::<TakeoverPolicy>(), Ok(p));
            assert_eq!(p.to_string(), p.as_str());
        }
        for m in [NumberMode::Rfc, NumberMode::RejectPrecisionLoss] {
            assert_eq!(m.as_str().parse::<NumberMode>(), Ok(m));
        }
        for j in [Jitter::Equal, Jitter::Full] {
            assert_eq!(j.as_str().parse::<Jitter>(), Ok(j));
        }
        for k in [
            AttemptKind::Response,
            AttemptKind::Timeout,
            AttemptKind::ConnectionError,
            AttemptKind::OutcomeUnknown,
            AttemptKind::KeyReused,
            AttemptKind::InFlight,
            AttemptKind::ResponseNotRetained,
        ] {
            assert_eq!(k.as_str().parse::<AttemptKind>(), Ok(k));
            assert_eq!(k.outcome(Some(7)).is_none(), k == AttemptKind::Response);
        }
        assert_eq!(
            AttemptKind::InFlight.outcome(Some(1500)),
            Some(AttemptOutcome::InFlight {
                retry_after_ms: Some(1500)
            })
        );
        assert_eq!(
            AttemptKind::Timeout.outcome(Some(1500)),
            Some(AttemptOutcome::Timeout)
        );
    }

    #[test]
    fn errors_list_the_accepted_values() {
        let e = "rerun".parse::<TakeoverPolicy>().expect_err("unknown");
        assert_eq!(
            e.to_string(),
            "takeover must be one of \"outcome_unknown\", \"re_run\", got \"rerun\""
        );
        assert_eq!(e.code(), "invalid_takeover");
        let e = "strict".parse::<NumberMode>().expect_err("alias removed");
        assert_eq!(
            e.to_string(),
            "numbers must be one of \"reject_precision_loss\", \"rfc\", got \"strict\" (\"strict\" is now \"reject_precision_loss\")"
        );
        assert!(
            "Full".parse::<Jitter>().is_err(),
            "names are case-sensitive"
        );
    }
}
