//! Idempotent function calls and message consumers, on the same [`ServerFlow`](super::ServerFlow).
//!
//! A call is a request whose "HTTP" parts are fixed by this module (`spec/PROTOCOL.md` §14):
//!
//! - its record is addressed by [`ScopeId::from_parts`]`(principal, "CALL", name, key)`, so a
//!   function's keys never meet an HTTP route's (no route is called `CALL`);
//! - its fingerprint is core's v1 fingerprint of `("CALL", name, application/json, payload)`
//!   under the host's [`Fingerprinter`] (canonical JSON, excluded pointers, HMAC): the same
//!   framing as a JSON request, with the method `CALL` and the function's name as the route;
//! - what it returned is a [`HandlerResponse`] of status [`RESULT_STATUS`] whose content type
//!   names the serializer ([`result_media_type`]) and whose body is the encoded result; an error
//!   the function raised is, by the host's [`ErrorDisposition`], a stored response of status
//!   [`STORED_ERROR_STATUS`] ([`ERROR_MEDIA_TYPE`]), a release of the key, or an abandon to the
//!   takeover policy. Both go through the route's [`ResponsePolicy`](crate::policy::ResponsePolicy)
//!   like any HTTP response (size cap, transient statuses).
//!
//! [`CallAnswer::of`] reads the flow's final action back as what the caller of the function
//! gets: the result (live or replayed), the stored error, or the reason it was not run.
//! [`wait_delay`] is the bounded, jittered poll of a consumer that waits for a call in flight
//! instead of failing.
use thiserror::Error;

use super::io::{Action, Event, HandlerResponse, HttpResponse, Outcome};
use super::problem::PROBLEM_CONTENT_TYPE;
use crate::fingerprint::{Fingerprint, FingerprintError, Fingerprinter, RequestParts};
use crate::scope::ScopeId;

/// The method of every call's scope and fingerprint framing.
pub const CALL_METHOD: &str = "CALL";
/// The status of a call's returned result.
pub const RESULT_STATUS: u16 = 200;
/// The status of a stored error (stored by the default policy: 4xx, not transient).
pub const STORED_ERROR_STATUS: u16 = 400;
/// The media type of a returned result, completed by `; serializer=<name>`.
pub const RESULT_MEDIA_TYPE: &str = "application/vnd.idempo.result";
/// The media type of a stored error; its body is what the host encoded (JSON by convention).
pub const ERROR_MEDIA_TYPE: &str = "application/vnd.idempo.error+json";
/// Longest function name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest call key, in bytes.
pub const MAX_KEY_BYTES: usize = 512;
/// Longest serializer name, in bytes.
pub const MAX_SERIALIZER_BYTES: usize = 64;
/// First delay of [`wait_delay`].
pub const WAIT_FIRST_DELAY_MS: u64 = 50;
/// Largest delay of [`wait_delay`].
pub const WAIT_MAX_DELAY_MS: u64 = 2_000;

/// A call's name, key or serializer that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CallError {
    /// The function name is empty or longer than [`MAX_NAME_BYTES`].
    #[error("the function name must be 1 to 256 bytes, got {0} bytes: pass name=")]
    BadName(usize),
    /// The key is empty or longer than [`MAX_KEY_BYTES`].
    #[error("the call key must be 1 to 512 bytes, got {0} bytes: check the key function")]
    BadKey(usize),
    /// The serializer name is not 1 to 64 of `A-Z a-z 0-9 . _ -`.
    #[error("serializer name {0:?} must be 1 to 64 of A-Z a-z 0-9 . _ -")]
    BadSerializer(String),
}

impl CallError {
    /// Stable snake_case code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadName(_) => "bad_name",
            Self::BadKey(_) => "bad_key",
            Self::BadSerializer(_) => "bad_serializer",
        }
    }
}

/// One idempotent function: its validated name, which is the route of its calls.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Call {
    name: String,
}

impl Call {
    /// The function called `name` (1 to [`MAX_NAME_BYTES`] bytes; e.g. `billing.charge`).
    ///
    /// # Errors
    /// [`CallError::BadName`].
    pub fn new(name: &str) -> Result<Self, CallError> {
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(CallError::BadName(name.len()));
        }
        Ok(Self {
            name: name.to_owned(),
        })
    }

    /// The function's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The record of `key` (a message id, a job id, or a payload fingerprint) for `principal`
    /// (tenant; `""` for none).
    ///
    /// # Errors
    /// [`CallError::BadKey`] for an empty key or one longer than [`MAX_KEY_BYTES`].
    pub fn scope(&self, principal: &str, key: &str) -> Result<ScopeId, CallError> {
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return Err(CallError::BadKey(key.len()));
        }
        Ok(ScopeId::from_parts(principal, CALL_METHOD, &self.name, key))
    }

    /// The request parts a call's `payload` (JSON bytes) is fingerprinted as.
    #[must_use]
    pub fn parts<'a>(&'a self, payload: &'a [u8]) -> RequestParts<'a> {
        RequestParts::json(CALL_METHOD, &self.name, payload)
    }

    /// The fingerprint of a call's `payload` (JSON bytes) under `fingerprinter`.
    ///
    /// # Errors
    /// [`FingerprintError::Body`] when the payload is not acceptable canonical-JSON input.
    pub fn fingerprint(
        &self,
        fingerprinter: &Fingerprinter,
        payload: &[u8],
    ) -> Result<Fingerprint, FingerprintError> {
        fingerprinter.fingerprint(&self.parts(payload))
    }
}

/// `application/vnd.idempo.result; serializer=<name>`.
///
/// # Errors
/// [`CallError::BadSerializer`].
pub fn result_media_type(serializer: &str) -> Result<String, CallError> {
    let ok = !serializer.is_empty()
        && serializer.len() <= MAX_SERIALIZER_BYTES
        && serializer
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        return Err(CallError::BadSerializer(serializer.to_owned()));
    }
    Ok(format!("{RESULT_MEDIA_TYPE}; serializer={serializer}"))
}

/// What the host does with an error the function raised, chosen per error by the user.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum ErrorDisposition {
    /// A deterministic failure: stored (status [`STORED_ERROR_STATUS`]); a redelivery gets the
    /// same error without running.
    Store,
    /// The function certainly had no effect (validation, a refused precondition): the key is
    /// released, a redelivery runs it again.
    Release,
    /// It may have acted before failing: the record goes to the takeover policy (its lease
    /// expired at once; under `outcome_unknown` marked so, under `re_run` run again).
    Unknown,
}

impl ErrorDisposition {
    /// `"store"`, `"release"` or `"unknown"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Store => "store",
            Self::Release => "release",
            Self::Unknown => "unknown",
        }
    }

    /// The disposition called `name` (see [`ErrorDisposition::as_str`]).
    #[must_use]
    pub fn named(name: &str) -> Option<Self> {
        [Self::Store, Self::Release, Self::Unknown]
            .into_iter()
            .find(|d| d.as_str() == name)
    }
}

/// The event that tells the flow the function returned `body`, encoded by `serializer`.
///
/// # Errors
/// [`CallError::BadSerializer`].
pub fn returned(serializer: &str, body: Vec<u8>) -> Result<Event, CallError> {
    let media = result_media_type(serializer)?;
    Ok(Event::HandlerFinished(HandlerResponse::new(
        RESULT_STATUS,
        vec![("content-type".to_owned(), media)],
        body,
    )))
}

/// The event that tells the flow the function raised, under `disposition`; `body` is the
/// encoded error, stored under [`ErrorDisposition::Store`] (ignored otherwise).
pub fn raised(disposition: ErrorDisposition, body: Vec<u8>) -> Event {
    match disposition {
        ErrorDisposition::Store => Event::HandlerFinished(HandlerResponse::new(
            STORED_ERROR_STATUS,
            vec![("content-type".to_owned(), ERROR_MEDIA_TYPE.to_owned())],
            body,
        )),
        ErrorDisposition::Release => Event::HandlerFailed {
            maybe_side_effect: false,
        },
        ErrorDisposition::Unknown => Event::HandlerFailed {
            maybe_side_effect: true,
        },
    }
}

/// What the caller of an idempotent function gets, read from the flow's final action.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum CallAnswer {
    /// The function's result: `body` encoded by `serializer`; `replayed` when it ran earlier
    /// (this call did not run it).
    Returned {
        /// The serializer named when it was stored.
        serializer: String,
        /// The encoded result.
        body: Vec<u8>,
        /// True when read from the record.
        replayed: bool,
    },
    /// An error stored under [`ErrorDisposition::Store`]: `body` as the host encoded it.
    StoredError {
        /// The encoded error.
        body: Vec<u8>,
        /// True when read from the record.
        replayed: bool,
    },
    /// The function raised and nothing was stored: the host re-raises the original error.
    Propagate,
    /// The call ran earlier, but its result was too large to retain.
    NotRetained,
    /// Another call holds the key (running now); retry after `retry_after_ms`.
    InFlight {
        /// The hint, in milliseconds.
        retry_after_ms: u64,
    },
    /// The key was used with a different payload.
    Mismatch,
    /// A call with this key ran and its outcome is unknown (it may have acted).
    OutcomeUnknown,
    /// The store failed, was contended, or (transactional mode) did not commit; nothing this
    /// call did was recorded. Retry after `retry_after_ms`.
    Unavailable {
        /// How the call ended (`store_unavailable`, `contention`, `not_committed`, ...).
        outcome: Outcome,
        /// The hint, in milliseconds.
        retry_after_ms: u64,
    },
    /// The record holds a response this module did not write (a foreign or corrupt record).
    Foreign {
        /// Its status.
        status: u16,
    },
}

/// [`CallAnswer`] as flat fields ([`CallAnswer::into_flat`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlatCallAnswer {
    /// [`CallAnswer::kind`].
    pub kind: &'static str,
    /// `returned`: the serializer named when it was stored.
    pub serializer: Option<String>,
    /// `returned`, `stored_error`: the encoded result or error.
    pub body: Option<Vec<u8>>,
    /// `returned`, `stored_error`: read from the record (this call did not run the function).
    pub replayed: bool,
    /// `in_flight`, `unavailable`: when to try again, in milliseconds.
    pub retry_after_ms: Option<u64>,
    /// `unavailable`: how the call ended.
    pub outcome: Option<Outcome>,
    /// `foreign`: the record's status.
    pub status: Option<u16>,
}

impl CallAnswer {
    /// The answer of a finished flow (`None` for an action that does not end it).
    #[must_use]
    pub fn of(action: &Action) -> Option<Self> {
        match action {
            Action::Respond { response, outcome } => Some(Self::of_response(response, *outcome)),
            Action::PropagateError { .. } => Some(Self::Propagate),
            _ => None,
        }
    }

    /// The answer of a finished flow's response and outcome (as a binding holds them).
    pub fn of_response(response: &HttpResponse, outcome: Outcome) -> Self {
        let retry_after_ms = retry_after_ms(response);
        match outcome {
            Outcome::Replayed => Self::decode(response, true),
            // The function ran here: its own response (the result, or the stored error), also
            // when the record could not be written (the caller still gets what it returned).
            Outcome::Stored
            | Outcome::NotStored
            | Outcome::NotRetained
            | Outcome::LeaseLost
            | Outcome::CompletionFailed
            | Outcome::HandlerFailed => Self::decode(response, false),
            Outcome::InFlight => Self::InFlight { retry_after_ms },
            Outcome::Mismatch => Self::Mismatch,
            Outcome::OutcomeUnknown => Self::OutcomeUnknown,
            Outcome::NotCommitted | Outcome::StoreUnavailable | Outcome::Contention => {
                Self::Unavailable {
                    outcome,
                    retry_after_ms,
                }
            }
        }
    }

    fn decode(response: &HttpResponse, replayed: bool) -> Self {
        let media = content_type(response).unwrap_or("");
        let (essence, params) = media.split_once(';').unwrap_or((media, ""));
        let essence = essence.trim();
        if essence.eq_ignore_ascii_case(RESULT_MEDIA_TYPE) {
            if let Some(serializer) = params.split(';').find_map(|p| {
                let (name, value) = p.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("serializer")
                    .then(|| value.trim().to_owned())
            }) {
                return Self::Returned {
                    serializer,
                    body: response.body.clone(),
                    replayed,
                };
            }
        } else if essence.eq_ignore_ascii_case(ERROR_MEDIA_TYPE) {
            return Self::StoredError {
                body: response.body.clone(),
                replayed,
            };
        } else if essence.eq_ignore_ascii_case(PROBLEM_CONTENT_TYPE) {
            return Self::NotRetained;
        }
        Self::Foreign {
            status: response.status,
        }
    }

    /// Stable snake_case name.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Returned { .. } => "returned",
            Self::StoredError { .. } => "stored_error",
            Self::Propagate => "propagate",
            Self::NotRetained => "not_retained",
            Self::InFlight { .. } => "in_flight",
            Self::Mismatch => "mismatch",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::Unavailable { .. } => "unavailable",
            Self::Foreign { .. } => "foreign",
        }
    }

    /// The answer as flat fields (`kind` and whichever of the others it carries), for hosts whose
    /// foreign-function layer carries records rather than enums (Python, Node).
    #[must_use]
    pub fn into_flat(self) -> FlatCallAnswer {
        let mut out = FlatCallAnswer {
            kind: self.kind(),
            ..FlatCallAnswer::default()
        };
        match self {
            Self::Returned {
                serializer,
                body,
                replayed,
            } => {
                out.serializer = Some(serializer);
                out.body = Some(body);
                out.replayed = replayed;
            }
            Self::StoredError { body, replayed } => {
                out.body = Some(body);
                out.replayed = replayed;
            }
            Self::InFlight { retry_after_ms } => out.retry_after_ms = Some(retry_after_ms),
            Self::Unavailable {
                retry_after_ms,
                outcome,
            } => {
                out.retry_after_ms = Some(retry_after_ms);
                out.outcome = Some(outcome);
            }
            Self::Foreign { status } => out.status = Some(status),
            Self::Propagate | Self::NotRetained | Self::Mismatch | Self::OutcomeUnknown => {}
        }
        out
    }
}

/// Every [`Outcome`], for [`outcome_named`].
pub(crate) const OUTCOMES: [Outcome; 13] = [
    Outcome::Stored,
    Outcome::NotStored,
    Outcome::NotRetained,
    Outcome::LeaseLost,
    Outcome::CompletionFailed,
    Outcome::NotCommitted,
    Outcome::HandlerFailed,
    Outcome::Replayed,
    Outcome::InFlight,
    Outcome::Mismatch,
    Outcome::OutcomeUnknown,
    Outcome::StoreUnavailable,
    Outcome::Contention,
];

/// The [`Outcome`] whose [`Outcome::as_str`] is `name` (a binding reading back its action).
#[must_use]
pub fn outcome_named(name: &str) -> Option<Outcome> {
    OUTCOMES.into_iter().find(|o| o.as_str() == name)
}

fn content_type(response: &HttpResponse) -> Option<&str> {
    response
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.as_str())
}

fn retry_after_ms(response: &HttpResponse) -> u64 {
    response
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("retry-after"))
        .and_then(|(_, v)| v.trim().parse::<u64>().ok())
        .map_or(1_000, |s| s.saturating_mul(1_000))
}

/// The pause before poll `attempt` (0-based) of a consumer waiting for a call in flight, or
/// `None` once `elapsed_ms + pause` would pass `budget_ms` (then the host raises in-flight).
///
/// Exponential from [`WAIT_FIRST_DELAY_MS`], capped by the in-flight answer's `retry_after_ms`
/// and [`WAIT_MAX_DELAY_MS`], with jitter: `jitter` (host randomness, `0..=u16::MAX`) picks the
/// pause in `[cap/2, cap]`, so consumers woken together spread out.
#[must_use]
pub fn wait_delay(
    attempt: u32,
    retry_after_ms: u64,
    elapsed_ms: u64,
    budget_ms: u64,
    jitter: u16,
) -> Option<u64> {
    let grown = WAIT_FIRST_DELAY_MS.saturating_mul(1u64 << attempt.min(16));
    let cap = grown
        .min(retry_after_ms.max(WAIT_FIRST_DELAY_MS))
        .min(WAIT_MAX_DELAY_MS);
    let half = cap / 2;
    let delay = half + (cap - half) * u64::from(jitter) / u64::from(u16::MAX);
    (elapsed_ms.saturating_add(delay) <= budget_ms).then_some(delay)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::fingerprint::FingerprintConfig;
    use crate::machine::{ServerFlow, StoreResult};
    use crate::policy::Config;
    use crate::record::FingerprintText;

    fn flow_running() -> ServerFlow {
        let call = Call::new("billing.charge").unwrap();
        let scope = call.scope("", "msg-1").unwrap();
        let fp = Fingerprinter::new(&FingerprintConfig::default()).unwrap();
        let text = FingerprintText::from(&call.fingerprint(&fp, b"{\"a\":1}").unwrap());
        let (mut flow, first) =
            ServerFlow::start(scope, text, Arc::new(Config::default()), [1; 16]);
        assert!(matches!(first, Action::Store(_)));
        let run = flow
            .handle(Event::Store(StoreResult::Claimed {
                generation: 1,
                now_ms: 0,
            }))
            .unwrap();
        assert!(matches!(run, Action::RunHandler(_)));
        flow
    }

    #[test]
    fn call_fingerprint_is_the_json_framing_with_call_and_the_name() {
        let fp = Fingerprinter::new(&FingerprintConfig::default()).unwrap();
        let call = Call::new("billing.charge").unwrap();
        let a = call.fingerprint(&fp, br#"{"b":1,"a":2}"#).unwrap();
        let b = fp
            .fingerprint(&RequestParts::json(
                "CALL",
                "billing.charge",
                br#"{"a":2,"b":1}"#,
            ))
            .unwrap();
        assert_eq!(a, b);
        let other = Call::new("billing.refund").unwrap();
        assert_ne!(a, other.fingerprint(&fp, br#"{"b":1,"a":2}"#).unwrap());
    }

    #[test]
    fn scope_is_the_scope_of_method_call() {
        let call = Call::new("f").unwrap();
        assert_eq!(
            call.scope("t", "k").unwrap(),
            ScopeId::from_parts("t", "CALL", "f", "k")
        );
        assert_eq!(call.scope("", ""), Err(CallError::BadKey(0)));
        assert_eq!(Call::new(""), Err(CallError::BadName(0)));
    }

    #[test]
    fn a_returned_result_is_stored_and_read_back() {
        let mut flow = flow_running();
        let done = flow
            .handle(returned("json", b"{\"ok\":true}".to_vec()).unwrap())
            .unwrap();
        let Action::Store(crate::machine::StoreOp::Complete { response, .. }) = done else {
            panic!("expected complete, got {done:?}");
        };
        let stored = crate::record::StoredResponse::decode(&response).unwrap();
        let replay =
            CallAnswer::of_response(&crate::machine::replay_response(&stored), Outcome::Replayed);
        assert_eq!(
            replay,
            CallAnswer::Returned {
                serializer: "json".into(),
                body: b"{\"ok\":true}".to_vec(),
                replayed: true
            }
        );
        let end = flow
            .handle(Event::Store(StoreResult::Completed(true)))
            .unwrap();
        assert!(matches!(
            CallAnswer::of(&end),
            Some(CallAnswer::Returned {
                replayed: false,
                ..
            })
        ));
    }

    #[test]
    fn error_dispositions_map_to_store_release_and_abandon() {
        let mut flow = flow_running();
        let a = flow
            .handle(raised(ErrorDisposition::Store, b"{}".to_vec()))
            .unwrap();
        assert!(matches!(
            a,
            Action::Store(crate::machine::StoreOp::Complete { .. })
        ));
        let mut flow = flow_running();
        let a = flow
            .handle(raised(ErrorDisposition::Release, Vec::new()))
            .unwrap();
        assert!(matches!(
            a,
            Action::Store(crate::machine::StoreOp::Release { .. })
        ));
        let mut flow = flow_running();
        let a = flow
            .handle(raised(ErrorDisposition::Unknown, Vec::new()))
            .unwrap();
        assert!(matches!(
            a,
            Action::Store(crate::machine::StoreOp::Renew { lease_ms: 0, .. })
        ));
    }

    /// `spec/vectors/call/call.json`, generated by an independent model (its `generate.py`).
    #[test]
    fn call_vectors() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../../spec/vectors/call/call.json")).unwrap();
        let cases = doc["cases"].as_array().unwrap();
        assert!(cases.len() >= 7);
        for case in cases {
            let s = |k: &str| case[k].as_str().unwrap_or_else(|| panic!("{k}"));
            let name = s("name");
            let call = Call::new(s("function")).unwrap();
            let scope = call.scope(s("principal"), s("key")).unwrap();
            assert_eq!(scope.to_hex(), s("scope_hex"), "{name}: scope");
            let config = FingerprintConfig {
                exclude: case["exclude"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p.as_str().unwrap().to_owned())
                    .collect(),
                hmac_key: case["hmac_key"].as_str().map(|k| k.as_bytes().to_vec()),
                ..FingerprintConfig::default()
            };
            let fp = Fingerprinter::new(&config).unwrap();
            let got = call.fingerprint(&fp, s("payload").as_bytes()).unwrap();
            assert_eq!(got.to_string(), s("fingerprint"), "{name}: fingerprint");
        }
        let result = &doc["result"];
        let Event::HandlerFinished(r) = returned(
            result["serializer"].as_str().unwrap(),
            result["body"].as_str().unwrap().as_bytes().to_vec(),
        )
        .unwrap() else {
            panic!("returned is a handler response");
        };
        assert_eq!(u64::from(r.status), result["status"].as_u64().unwrap());
        assert_eq!(r.headers[0].1, result["content_type"].as_str().unwrap());
        let Event::HandlerFinished(e) = raised(ErrorDisposition::Store, Vec::new()) else {
            panic!("a stored error is a handler response");
        };
        let stored = &doc["stored_error"];
        assert_eq!(u64::from(e.status), stored["status"].as_u64().unwrap());
        assert_eq!(e.headers[0].1, stored["content_type"].as_str().unwrap());
        for w in doc["wait_delay"].as_array().unwrap() {
            let n = |k: &str| w[k].as_u64().unwrap();
            let got = wait_delay(
                u32::try_from(n("attempt")).unwrap(),
                n("retry_after_ms"),
                n("elapsed_ms"),
                n("budget_ms"),
                u16::try_from(n("jitter")).unwrap(),
            );
            assert_eq!(got, w["delay_ms"].as_u64(), "{w}");
        }
    }

    #[test]
    fn every_outcome_is_named() {
        for o in OUTCOMES {
            assert_eq!(outcome_named(o.as_str()), Some(o));
            // A new outcome must be added to OUTCOMES and answered by `of_response`.
            match o {
                Outcome::Stored
                | Outcome::NotStored
                | Outcome::NotRetained
                | Outcome::LeaseLost
                | Outcome::CompletionFailed
                | Outcome::NotCommitted
                | Outcome::HandlerFailed
                | Outcome::Replayed
                | Outcome::InFlight
                | Outcome::Mismatch
                | Outcome::OutcomeUnknown
                | Outcome::StoreUnavailable
                | Outcome::Contention => {}
            }
        }
        assert_eq!(outcome_named("nope"), None);
    }

    #[test]
    fn serializer_names_are_tokens() {
        assert!(result_media_type("json").is_ok());
        assert!(result_media_type("pydantic.v2").is_ok());
        assert!(result_media_type("a;b").is_err());
        assert!(result_media_type("").is_err());
    }

    #[test]
    fn wait_delay_grows_is_capped_jittered_and_bounded() {
        assert_eq!(wait_delay(0, 1_000, 0, 10_000, u16::MAX), Some(50));
        assert_eq!(wait_delay(0, 1_000, 0, 10_000, 0), Some(25));
        assert_eq!(wait_delay(3, 1_000, 0, 10_000, u16::MAX), Some(400));
        assert_eq!(wait_delay(10, 1_000, 0, 10_000, u16::MAX), Some(1_000));
        assert_eq!(wait_delay(30, 60_000, 0, 10_000, u16::MAX), Some(2_000));
        assert_eq!(wait_delay(0, 1_000, 9_990, 10_000, u16::MAX), None);
    }

    /// The codes the bindings' typed errors carry, and the name a call reads back.
    #[test]
    fn call_errors_have_stable_codes_and_a_call_its_name() {
        assert_eq!(CallError::BadName(0).code(), "bad_name");
        assert_eq!(CallError::BadKey(0).code(), "bad_key");
        assert_eq!(
            CallError::BadSerializer("a b".into()).code(),
            "bad_serializer"
        );
        assert_eq!(
            Call::new("billing.charge").unwrap().name(),
            "billing.charge"
        );
        assert_eq!(Call::new(""), Err(CallError::BadName(0)));
    }

    #[test]
    fn a_call_key_is_1_to_512_bytes() {
        let call = Call::new("billing.charge").unwrap();
        assert!(call.scope("", &"k".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(call.scope("", "k").is_ok());
        assert_eq!(
            call.scope("", &"k".repeat(MAX_KEY_BYTES + 1)),
            Err(CallError::BadKey(MAX_KEY_BYTES + 1))
        );
        assert_eq!(call.scope("", ""), Err(CallError::BadKey(0)));
    }

    /// An in-flight or unavailable answer carries the flow's `Retry-After` in milliseconds
    /// (one second when the response has none).
    #[test]
    fn retry_after_is_read_from_the_response() {
        let with = |headers: Vec<(String, String)>| HttpResponse {
            status: 409,
            headers,
            body: vec![],
        };
        assert_eq!(
            CallAnswer::of_response(
                &with(vec![("Retry-After".into(), " 3 ".into())]),
                Outcome::InFlight
            ),
            CallAnswer::InFlight {
                retry_after_ms: 3_000
            }
        );
        assert_eq!(
            CallAnswer::of_response(&with(vec![]), Outcome::StoreUnavailable),
            CallAnswer::Unavailable {
                outcome: Outcome::StoreUnavailable,
                retry_after_ms: 1_000
            }
        );
    }

    #[test]
    fn dispositions_read_back_by_name() {
        for (d, name) in [
            (ErrorDisposition::Store, "store"),
            (ErrorDisposition::Release, "release"),
            (ErrorDisposition::Unknown, "unknown"),
        ] {
            assert_eq!(d.as_str(), name);
            assert_eq!(ErrorDisposition::named(name), Some(d));
        }
        assert_eq!(ErrorDisposition::named("Store"), None);
        assert_eq!(ErrorDisposition::named(""), None);
    }

    /// Each answer's kind, and the flat form the bindings carry, field by field.
    #[test]
    fn answers_flatten_with_their_kind_and_fields() {
        assert_eq!(
            CallAnswer::of(&Action::PropagateError {
                outcome: Outcome::HandlerFailed
            }),
            Some(CallAnswer::Propagate)
        );
        assert_eq!(CallAnswer::of(&Action::Wait), None);
        let flat = |a: CallAnswer| a.into_flat();
        assert_eq!(
            flat(CallAnswer::Returned {
                serializer: "json".into(),
                body: b"1".to_vec(),
                replayed: true,
            }),
            FlatCallAnswer {
                kind: "returned",
                serializer: Some("json".into()),
                body: Some(b"1".to_vec()),
                replayed: true,
                ..FlatCallAnswer::default()
            }
        );
        assert_eq!(
            flat(CallAnswer::StoredError {
                body: b"e".to_vec(),
                replayed: false,
            }),
            FlatCallAnswer {
                kind: "stored_error",
                body: Some(b"e".to_vec()),
                ..FlatCallAnswer::default()
            }
        );
        assert_eq!(
            flat(CallAnswer::InFlight {
                retry_after_ms: 1_000
            }),
            FlatCallAnswer {
                kind: "in_flight",
                retry_after_ms: Some(1_000),
                ..FlatCallAnswer::default()
            }
        );
        assert_eq!(
            flat(CallAnswer::Unavailable {
                outcome: Outcome::Contention,
                retry_after_ms: 1_000,
            }),
            FlatCallAnswer {
                kind: "unavailable",
                retry_after_ms: Some(1_000),
                outcome: Some(Outcome::Contention),
                ..FlatCallAnswer::default()
            }
        );
        assert_eq!(
            flat(CallAnswer::Foreign { status: 201 }),
            FlatCallAnswer {
                kind: "foreign",
                status: Some(201),
                ..FlatCallAnswer::default()
            }
        );
        for (a, kind) in [
            (CallAnswer::Propagate, "propagate"),
            (CallAnswer::NotRetained, "not_retained"),
            (CallAnswer::Mismatch, "mismatch"),
            (CallAnswer::OutcomeUnknown, "outcome_unknown"),
        ] {
            assert_eq!(a.kind(), kind);
            assert_eq!(
                flat(a),
                FlatCallAnswer {
                    kind,
                    ..FlatCallAnswer::default()
                }
            );
        }
    }
}
