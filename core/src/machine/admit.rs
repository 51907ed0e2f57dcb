//! Admission: everything a host decides about a request before the [`ServerFlow`] starts, in the
//! normative order of `spec/PROTOCOL.md` §7.2 (missing key → key syntax → body size →
//! fingerprint → scope).
//!
//! The order is enforced by types: each stage is a value the host can only get from the stage
//! before it, and each stage ends in a [`Refusal`] (a problem response to send; nothing runs),
//! a pass-through, or the next stage.
//!
//! 1. [`admit`] takes the raw `Idempotency-Key` field values, the declared body length (if the
//!    host knows it) and the route's [`Config`] → [`KeyStage`]: [`KeyStage::PassThrough`] (no
//!    key on a route where it is optional: run the handler unprotected, read nothing),
//!    [`KeyStage::Refuse`] (400 `missing-key` / `invalid-key`, or 413 when the declared length
//!    is already over the limit), or [`KeyStage::Continue`] with an [`AwaitingBody`] that says
//!    how many body bytes the host may read.
//! 2. [`AwaitingBody::body`] takes the body as read ([`BodyRead`]) and the route's prepared
//!    [`Fingerprinter`] → [`BodyStage`]: 413 `body-too-large`, 400 `invalid-body` (the
//!    canonicalizer's refusal, mapped by [`problem::invalid_body`]), or an [`AwaitingScope`].
//! 3. [`AwaitingScope::scope`] takes the route's [`ScopeRule`], what its scope function gave
//!    ([`ScopeResolution`]), whether the request is authenticated, the method and the route
//!    template → [`ScopeStage`]: 500 `scope-unresolved` (with a log line for the host), or
//!    [`Admitted`] (key, [`ScopeId`], fingerprint, and possibly a warning for the host to emit).
//!
//! [`ServerFlow`]: super::ServerFlow
use thiserror::Error;

use super::io::HttpResponse;
use super::memory::Partition;
use super::problem::{self, ProblemKind, problem_response};
use crate::canonical::{CanonError, CanonErrorKind};
use crate::fingerprint::{FingerprintError, Fingerprinter, RequestParts};
use crate::key::{IdempotencyKey, parse_key_bytes};
use crate::policy::{Config, KeyRequirement};
use crate::record::FingerprintText;
use crate::scope::ScopeId;

/// What to do with a request that has no `Idempotency-Key`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum MissingKey {
    /// Answer with this 400 problem.
    Reject(HttpResponse),
    /// The key is optional on this route: run the handler without idempotency protection.
    RunUnprotected,
}

/// The answer for a request without a key, per [`Config::key`].
pub fn missing_key(config: &Config) -> MissingKey {
    match config.key {
        KeyRequirement::Required => {
            MissingKey::Reject(problem_response(ProblemKind::MissingKey, None, None, None))
        }
        KeyRequirement::Optional => MissingKey::RunUnprotected,
    }
}

/// A request admission refused: the problem response to send. The handler does not run and no
/// store operation happens.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct Refusal {
    /// The problem kind (`missing-key`, `invalid-key`, `body-too-large`, `invalid-body`,
    /// `scope-unresolved`).
    pub kind: ProblemKind,
    /// The response to send.
    pub response: HttpResponse,
    /// A line the host logs (at error level) when the refusal points at a server-side
    /// configuration problem (`scope-unresolved`); `None` for client errors.
    pub log: Option<String>,
}

impl Refusal {
    fn new(kind: ProblemKind, response: HttpResponse) -> Self {
        Self {
            kind,
            response,
            log: None,
        }
    }

    /// The outcome name for metrics: the problem slug in snake_case (`missing_key`,
    /// `invalid_key`, `body_too_large`, `invalid_body`, `scope_unresolved`).
    #[must_use]
    pub fn outcome(&self) -> &'static str {
        match self.kind {
            ProblemKind::MissingKey => "missing_key",
            ProblemKind::InvalidKey => "invalid_key",
            ProblemKind::BodyTooLarge => "body_too_large",
            ProblemKind::InvalidBody => "invalid_body",
            ProblemKind::ScopeUnresolved => "scope_unresolved",
            ProblemKind::BodyUnavailable => "body_unavailable",
            // Admission refuses with the kinds above only.
            _ => "refused",
        }
    }
}

/// Stage 1's result (see [`admit`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum KeyStage {
    /// No key, and the route's key is optional: run the handler without idempotency protection
    /// (the host need not read the body).
    PassThrough,
    /// Answer this problem; nothing runs.
    Refuse(Refusal),
    /// The key is valid: read the body (at most [`AwaitingBody::body_limit`] bytes) and go on.
    Continue(AwaitingBody),
}

/// A request with a valid key, waiting for its body.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct AwaitingBody {
    key: IdempotencyKey,
    limit: usize,
}

/// Stage 1: the key, then the declared body size.
///
/// `key_fields` are the raw values of every `Idempotency-Key` field the request carries, in
/// order (none: no key). Several fields are joined with `", "` as HTTP combines them, which the
/// key grammar then refuses (a comma is never part of a key, `spec/KEYS.md` §1).
/// `declared_len` is the body length the request declares (`Content-Length`), when the host
/// knows it: a declared length over [`Config::max_request_body_bytes`] is refused here, after
/// the key checks, so the host never reads such a body.
pub fn admit(config: &Config, key_fields: &[&[u8]], declared_len: Option<u64>) -> KeyStage {
    let key = match key_fields {
        [] => {
            return match config.key {
                KeyRequirement::Required => KeyStage::Refuse(Refusal::new(
                    ProblemKind::MissingKey,
                    problem_response(ProblemKind::MissingKey, None, None, None),
                )),
                KeyRequirement::Optional => KeyStage::PassThrough,
            };
        }
        [one] => parse_key_bytes(one, &config.key_options),
        many => parse_key_bytes(&many.join(&b", "[..]), &config.key_options),
    };
    let key = match key {
        Ok(key) => key,
        Err(e) => {
            return KeyStage::Refuse(Refusal::new(
                ProblemKind::InvalidKey,
                problem::invalid_key(&e),
            ));
        }
    };
    let limit = config.max_request_body_bytes.get();
    if let Some(len) = declared_len {
        if usize::try_from(len).map_or(true, |len| len > limit) {
            return KeyStage::Refuse(too_large(limit));
        }
    }
    KeyStage::Continue(AwaitingBody { key, limit })
}

fn too_large(limit: usize) -> Refusal {
    let err = CanonError {
        kind: CanonErrorKind::InputTooLarge { limit },
        offset: limit,
        pointer: None,
    };
    Refusal::new(ProblemKind::BodyTooLarge, problem::invalid_body(&err))
}

/// The refusal of a body the host could not read (a server-side configuration problem: logged).
fn body_unavailable(fix: &str) -> Refusal {
    let kind = ProblemKind::BodyUnavailable;
    let detail = format!("{} {fix}", kind.default_detail());
    Refusal {
        kind,
        response: problem_response(kind, Some(&detail), None, None),
        log: Some(format!(
            "idempo: a protected request's body was consumed before idempo could read it, so it \
             cannot be fingerprinted; the request was refused with 500 body-unavailable and \
             nothing ran. {fix}"
        )),
    }
}

/// The request body as the host read it.
#[derive(Clone, Copy, Debug)]
pub enum BodyRead<'a> {
    /// The whole body was read: the request parts to fingerprint (`route` is the concrete
    /// request target, path and query, `spec/CANONICAL.md` §2.1).
    Complete(RequestParts<'a>),
    /// The host stopped reading once the body passed the limit, after `read` bytes.
    OverLimit {
        /// Bytes read before the host stopped.
        read: u64,
    },
    /// The request has a body (a `Content-Length` above 0, or `Transfer-Encoding`) but its bytes
    /// are gone: an application body parser read them before the host could, and kept none.
    /// Refused with 500 `body-unavailable` (never fingerprinted as an empty body); `fix` is the
    /// host's sentence naming how to keep the bytes (e.g. the framework's raw-body hook), put in
    /// the problem's detail and the log line.
    Unavailable {
        /// The host's fix, one sentence.
        fix: &'a str,
    },
}

/// Stage 2's result (see [`AwaitingBody::body`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum BodyStage {
    /// Answer this problem (413 or 400); nothing runs.
    Refuse(Refusal),
    /// The body has a fingerprint: resolve the scope.
    Continue(AwaitingScope),
}

/// A non-body failure of the fingerprinter (a configuration error, never a request's fault).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("the fingerprint could not be computed: {0}")]
pub struct FingerprintFailed(pub String);

impl AwaitingBody {
    /// The key, as parsed.
    #[must_use]
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The most body bytes the host reads ([`Config::max_request_body_bytes`]); the host stops
    /// at the first chunk past it and reports [`BodyRead::OverLimit`].
    #[must_use]
    pub fn body_limit(&self) -> usize {
        self.limit
    }

    /// Stage 2: the body size, then the fingerprint.
    ///
    /// # Errors
    /// [`FingerprintFailed`] when the fingerprinter fails for a reason that is not the body's
    /// (it cannot, for a fingerprinter that was built; kept typed so no binding has to panic).
    pub fn body(
        self,
        read: BodyRead<'_>,
        fingerprinter: &Fingerprinter,
    ) -> Result<BodyStage, FingerprintFailed> {
        let parts = match read {
            BodyRead::OverLimit { .. } => return Ok(BodyStage::Refuse(too_large(self.limit))),
            BodyRead::Unavailable { fix } => return Ok(BodyStage::Refuse(body_unavailable(fix))),
            BodyRead::Complete(parts) if parts.body.len() > self.limit => {
                return Ok(BodyStage::Refuse(too_large(self.limit)));
            }
            BodyRead::Complete(parts) => parts,
        };
        match fingerprinter.fingerprint(&parts) {
            Ok(fp) => {
                let fingerprint = FingerprintText::new(fp.text().as_str())
                    .map_err(|e| FingerprintFailed(e.to_string()))?;
                Ok(BodyStage::Continue(AwaitingScope {
                    key: self.key,
                    fingerprint,
                }))
            }
            Err(FingerprintError::Body(e)) => {
                let kind = problem::body_problem_kind(&e);
                Ok(BodyStage::Refuse(Refusal::new(
                    kind,
                    problem::invalid_body(&e),
                )))
            }
            Err(other) => Err(FingerprintFailed(other.to_string())),
        }
    }
}

/// What a route declares about its scope (principal), built with [`ScopeRule::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScopeRule {
    /// A scope function is configured: it must give a non-empty principal string, else the
    /// request is refused (`scope-unresolved`). With `empty_is_anonymous`, an empty string is
    /// accepted as the anonymous principal.
    Function {
        /// An empty principal means "anonymous" (the shared namespace) instead of a refusal.
        empty_is_anonymous: bool,
    },
    /// The route is declared public: keys are shared by every caller (no principal).
    Public,
    /// Neither a function nor a declaration: the shared namespace, with a warning when the
    /// request is authenticated.
    Unset,
}

/// A contradictory scope declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ScopeRuleError {
    /// The route is declared public and has a scope function.
    #[error("a route cannot be public and have a scope function: drop one of them")]
    PublicWithFunction,
    /// "empty principal is anonymous" was declared without a scope function.
    #[error("an empty principal can only mean anonymous when a scope function is configured")]
    AnonymousWithoutFunction,
}

impl ScopeRule {
    /// The rule for a route with (or without) a scope function, declared public or not, and
    /// accepting an empty principal as anonymous or not.
    ///
    /// # Errors
    /// [`ScopeRuleError`] for a contradictory declaration.
    pub fn new(
        function: bool,
        public: bool,
        empty_is_anonymous: bool,
    ) -> Result<Self, ScopeRuleError> {
        match (function, public, empty_is_anonymous) {
            (true, true, _) => Err(ScopeRuleError::PublicWithFunction),
            (false, _, true) => Err(ScopeRuleError::AnonymousWithoutFunction),
            (true, false, a) => Ok(Self::Function {
                empty_is_anonymous: a,
            }),
            (false, true, false) => Ok(Self::Public),
            (false, false, false) => Ok(Self::Unset),
        }
    }
}

/// What the route's scope function gave for this request (the host calls it; core judges it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScopeResolution<'a> {
    /// No function was called (the rule is [`ScopeRule::Public`] or [`ScopeRule::Unset`]).
    NotCalled,
    /// It returned this string.
    Principal(&'a str),
    /// It returned nothing; the text is the host language's name for it (`None`,
    /// `undefined`, `null`).
    Nothing(&'a str),
    /// It returned something that is not a string; the text describes it (e.g. `int 42`).
    NotAString(&'a str),
    /// It raised; the text is the error's message (logged, never sent to the client).
    Raised(&'a str),
}

/// Stage 3's result (see [`AwaitingScope::scope`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum ScopeStage {
    /// Answer this problem (500 `scope-unresolved`) and log [`Refusal::log`]; nothing runs.
    Refuse(Refusal),
    /// The request is admitted: start the flow.
    Admitted(Admitted),
}

/// A request with a fingerprint, waiting for its scope.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct AwaitingScope {
    key: IdempotencyKey,
    fingerprint: FingerprintText,
}

/// An admitted request: what [`ServerFlow::start`](super::ServerFlow::start) needs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct Admitted {
    /// The key.
    pub key: IdempotencyKey,
    /// The record key: (principal, method, route template, key).
    pub scope: ScopeId,
    /// The request fingerprint.
    pub fingerprint: FingerprintText,
    /// The principal's quota partition, for a store that holds each principal to a quota (the
    /// memory store, `spec/STORAGE.md` §8); other stores ignore it.
    pub partition: Partition,
    /// A warning for the host to emit (once per route is enough): the request is authenticated
    /// but the route has no scope function, so its keys share one namespace.
    pub warning: Option<String>,
}

impl AwaitingScope {
    /// The key, as parsed.
    #[must_use]
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The fingerprint.
    #[must_use]
    pub fn fingerprint(&self) -> &FingerprintText {
        &self.fingerprint
    }

    /// Stage 3: the scope.
    ///
    /// With [`ScopeRule::Function`], a [`ScopeResolution::Principal`] that is non-empty (or empty
    /// with `empty_is_anonymous`) is the principal; anything else is refused with 500
    /// `scope-unresolved` naming the route, and a log line naming the route and what the
    /// function gave. [`ScopeRule::Public`] uses the shared namespace (principal `""`) silently;
    /// [`ScopeRule::Unset`] does too, with a warning when `authenticated`. A resolution that
    /// does not fit the rule (a principal for a rule that calls no function, or
    /// [`ScopeResolution::NotCalled`] for a function) is refused like an unresolved scope: fail
    /// closed.
    pub fn scope(
        self,
        rule: ScopeRule,
        resolution: ScopeResolution<'_>,
        authenticated: bool,
        method: &str,
        route: &str,
    ) -> ScopeStage {
        let principal = match (rule, resolution) {
            (ScopeRule::Function { .. }, ScopeResolution::Principal(p)) if !p.is_empty() => p,
            (
                ScopeRule::Function {
                    empty_is_anonymous: true,
                },
                ScopeResolution::Principal(""),
            ) => "",
            (ScopeRule::Public, ScopeResolution::NotCalled) => "",
            (ScopeRule::Unset, ScopeResolution::NotCalled) => {
                let warning = authenticated.then(|| unscoped_warning(method, route));
                return self.admitted("", method, route, warning);
            }
            (_, got) => return ScopeStage::Refuse(unresolved(rule, got, method, route)),
        };
        self.admitted(principal, method, route, None)
    }

    fn admitted(
        self,
        principal: &str,
        method: &str,
        route: &str,
        warning: Option<String>,
    ) -> ScopeStage {
        ScopeStage::Admitted(Admitted {
            scope: ScopeId::new(principal, method, route, &self.key),
            partition: Partition::of_principal(principal),
            key: self.key,
            fingerprint: self.fingerprint,
            warning,
        })
    }
}

/// The warning for an authenticated request on a route without a scope function.
fn unscoped_warning(method: &str, route: &str) -> String {
    format!(
        "idempo: route {method} {route} has no scope function configured and this request is \
         authenticated, so every caller's Idempotency-Keys share one namespace (one user's key \
         can replay another user's response). In your idempotency configuration, set a scope \
         function returning the principal (user, tenant or API client id), or declare the \
         route public if its keys are meant to be shared."
    )
}

fn unresolved(rule: ScopeRule, got: ScopeResolution<'_>, method: &str, route: &str) -> Refusal {
    let what = match got {
        ScopeResolution::NotCalled => "was not called".to_owned(),
        ScopeResolution::Principal("") => "returned an empty string".to_owned(),
        ScopeResolution::Principal(_) => "returned a principal for a route without one".to_owned(),
        ScopeResolution::Nothing(name) => format!("returned {name}"),
        ScopeResolution::NotAString(desc) => format!("returned a non-string ({desc})"),
        ScopeResolution::Raised(msg) => format!("raised: {msg}"),
    };
    let fix = match rule {
        ScopeRule::Function {
            empty_is_anonymous: false,
        } => {
            "Make your scope function return the principal (user, tenant or API client id) \
             for every request it sees: it runs before the handler, so read what your \
             authentication set at that point; or declare an empty principal anonymous, or \
             the route public."
        }
        _ => "Check the route's scope configuration.",
    };
    let detail = format!(
        "The idempotency scope of {method} {route} could not be resolved for this request, so \
         it was not processed."
    );
    Refusal {
        kind: ProblemKind::ScopeUnresolved,
        response: problem_response(ProblemKind::ScopeUnresolved, Some(&detail), None, None),
        log: Some(format!(
            "idempo: scope function of route {method} {route} {what}; the request was refused \
             with 500 scope-unresolved and nothing ran. {fix}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::FingerprintConfig;

    fn fp() -> Fingerprinter {
        Fingerprinter::new(&FingerprintConfig::default()).expect("default")
    }

    fn small() -> Config {
        Config {
            max_request_body_bytes: std::num::NonZeroUsize::new(8).expect("8"),
            ..Config::default()
        }
    }

    fn refused(stage: KeyStage) -> u16 {
        match stage {
            KeyStage::Refuse(r) => r.response.status,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn missing_key_comes_before_the_body_size() {
        let s = admit(&small(), &[], Some(1_000));
        assert!(matches!(&s, KeyStage::Refuse(r) if r.kind == ProblemKind::MissingKey));
        let optional = Config {
            key: KeyRequirement::Optional,
            ..small()
        };
        assert_eq!(admit(&optional, &[], Some(1_000)), KeyStage::PassThrough);
    }

    #[test]
    fn key_syntax_comes_before_the_body_size() {
        let s = admit(&small(), &[b"short"], Some(1_000));
        assert!(matches!(&s, KeyStage::Refuse(r) if r.kind == ProblemKind::InvalidKey));
        // Two fields: joined, then refused by the grammar (a comma is never in a key).
        let s = admit(&small(), &[b"abcdefgh1", b"abcdefgh2"], None);
        assert!(matches!(&s, KeyStage::Refuse(r) if r.kind == ProblemKind::InvalidKey));
        assert_eq!(refused(admit(&small(), &[b"abcdefgh1"], Some(9))), 413);
    }

    #[test]
    fn a_body_the_host_cannot_see_is_refused_never_fingerprinted_empty() {
        let KeyStage::Continue(b) = admit(&small(), &[b"abcdefgh1"], Some(5)) else {
            panic!("valid key");
        };
        let fix = "Keep the raw bytes (e.g. a verify hook).";
        let r = b.body(BodyRead::Unavailable { fix }, &fp());
        let Ok(BodyStage::Refuse(r)) = r else {
            panic!("refused");
        };
        assert_eq!(r.kind, ProblemKind::BodyUnavailable);
        assert_eq!(r.response.status, 500);
        assert_eq!(r.outcome(), "body_unavailable");
        let body = String::from_utf8(r.response.body.clone()).expect("utf-8");
        assert!(
            body.contains("urn:idempo:problem:body-unavailable"),
            "{body}"
        );
        assert!(body.contains(fix), "{body}");
        assert!(r.log.as_deref().is_some_and(|l| l.contains(fix)));
    }

    #[test]
    fn body_over_the_limit_is_413_then_json_is_checked() {
        let KeyStage::Continue(b) = admit(&small(), &[b"abcdefgh1"], None) else {
            panic!("valid key");
        };
        assert_eq!(b.body_limit(), 8);
        let over = b.clone().body(BodyRead::OverLimit { read: 9 }, &fp());
        assert!(matches!(over, Ok(BodyStage::Refuse(r)) if r.response.status == 413));
        let long = b
            .clone()
            .body(
                BodyRead::Complete(RequestParts::json("POST", "/p", b"[1,2,3,4,5]")),
                &fp(),
            )
            .expect("no config error");
        assert!(matches!(long, BodyStage::Refuse(r) if r.response.status == 413));
        let bad = b
            .clone()
            .body(
                BodyRead::Complete(RequestParts::json("POST", "/p", b"{")),
                &fp(),
            )
            .expect("no config error");
        assert!(
            matches!(bad, BodyStage::Refuse(ref r) if r.kind == ProblemKind::InvalidBody),
            "{bad:?}"
        );
        let ok = b
            .body(
                BodyRead::Complete(RequestParts::json("POST", "/p", b"{}")),
                &fp(),
            )
            .expect("no config error");
        assert!(matches!(ok, BodyStage::Continue(_)));
    }

    /// The body limit is inclusive: a declared length at the limit is read, one past it is
    /// answered 413 before any byte is read (`spec/PROTOCOL.md` §7.2).
    #[test]
    fn a_declared_length_at_the_limit_is_read() {
        assert!(matches!(
            admit(&small(), &[b"abcdefgh1"], Some(8)),
            KeyStage::Continue(_)
        ));
        assert_eq!(refused(admit(&small(), &[b"abcdefgh1"], Some(9))), 413);
        assert!(matches!(
            admit(&small(), &[b"abcdefgh1"], Some(u64::MAX)),
            KeyStage::Refuse(r) if r.kind == ProblemKind::BodyTooLarge
        ));
        // The same bound on the bytes read: 8 bytes are fingerprinted, 9 are refused.
        let KeyStage::Continue(b) = admit(&small(), &[b"abcdefgh1"], None) else {
            panic!("valid key");
        };
        let at = b.clone().body(
            BodyRead::Complete(RequestParts::json("POST", "/p", b"[1,2,34]")),
            &fp(),
        );
        assert!(matches!(at, Ok(BodyStage::Continue(_))), "{at:?}");
        let over = b.body(
            BodyRead::Complete(RequestParts::json("POST", "/p", b"[1,2,345]")),
            &fp(),
        );
        assert!(
            matches!(over, Ok(BodyStage::Refuse(ref r)) if r.response.status == 413),
            "{over:?}"
        );
    }

    /// The outcome names the metrics carry (`spec/METRICS.md`): one per refusal.
    #[test]
    fn each_refusal_names_its_outcome() {
        let KeyStage::Refuse(missing) = admit(&small(), &[], None) else {
            panic!("refused");
        };
        assert_eq!(missing.outcome(), "missing_key");
        let KeyStage::Refuse(invalid) = admit(&small(), &[b"short"], None) else {
            panic!("refused");
        };
        assert_eq!(invalid.outcome(), "invalid_key");
        let KeyStage::Refuse(large) = admit(&small(), &[b"abcdefgh1"], Some(9)) else {
            panic!("refused");
        };
        assert_eq!(large.outcome(), "body_too_large");
        let KeyStage::Continue(b) = admit(&small(), &[b"abcdefgh1"], None) else {
            panic!("valid key");
        };
        let Ok(BodyStage::Refuse(bad)) = b.body(
            BodyRead::Complete(RequestParts::json("POST", "/p", b"{")),
            &fp(),
        ) else {
            panic!("refused");
        };
        assert_eq!(bad.outcome(), "invalid_body");
    }

    fn awaiting_scope() -> AwaitingScope {
        let KeyStage::Continue(b) = admit(&Config::default(), &[b"abcdefgh1"], None) else {
            panic!("valid key");
        };
        match b
            .body(
                BodyRead::Complete(RequestParts::json("POST", "/p", b"{}")),
                &fp(),
            )
            .expect("no config error")
        {
            BodyStage::Continue(s) => s,
            BodyStage::Refuse(r) => panic!("{r:?}"),
        }
    }

    #[test]
    fn a_function_that_gives_nothing_usable_refuses() {
        let f = ScopeRule::new(true, false, false).expect("valid");
        for got in [
            ScopeResolution::Nothing("None"),
            ScopeResolution::Principal(""),
            ScopeResolution::NotAString("int 42"),
            ScopeResolution::Raised("KeyError: 'tenant_id'"),
            ScopeResolution::NotCalled,
        ] {
            match awaiting_scope().scope(f, got, true, "POST", "/payments") {
                ScopeStage::Refuse(r) => {
                    assert_eq!(r.response.status, 500);
                    assert_eq!(r.outcome(), "scope_unresolved");
                    let log = r.log.expect("log line");
                    assert!(log.contains("POST /payments"), "{log}");
                    let body = String::from_utf8(r.response.body).expect("utf-8");
                    assert!(!body.contains("scope function"), "{body}");
                    assert!(
                        body.contains("urn:idempo:problem:scope-unresolved"),
                        "{body}"
                    );
                    assert!(body.contains("POST /payments"), "{body}");
                    // The log's fix names what a scope function must do, not a generic hint
                    // (the client's body does not carry it).
                    assert!(
                        log.contains("Make your scope function return the principal"),
                        "{log}"
                    );
                }
                other => panic!("{got:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn principals_public_routes_and_the_unset_warning() {
        let f = ScopeRule::new(true, false, false).expect("valid");
        let ScopeStage::Admitted(a) =
            awaiting_scope().scope(f, ScopeResolution::Principal("u1"), true, "POST", "/p")
        else {
            panic!("admitted");
        };
        assert_eq!(a.scope, ScopeId::new("u1", "POST", "/p", &a.key));
        assert_eq!(a.warning, None);
        let anon = ScopeRule::new(true, false, true).expect("valid");
        assert!(matches!(
            awaiting_scope().scope(anon, ScopeResolution::Principal(""), true, "POST", "/p"),
            ScopeStage::Admitted(Admitted { warning: None, .. })
        ));
        let public = ScopeRule::new(false, true, false).expect("valid");
        assert!(matches!(
            awaiting_scope().scope(public, ScopeResolution::NotCalled, true, "POST", "/p"),
            ScopeStage::Admitted(Admitted { warning: None, .. })
        ));
        let unset = ScopeRule::new(false, false, false).expect("valid");
        let ScopeStage::Admitted(a) =
            awaiting_scope().scope(unset, ScopeResolution::NotCalled, true, "POST", "/p")
        else {
            panic!("admitted");
        };
        let w = a.warning.expect("warning");
        assert!(
            w.contains("POST /p") && w.contains("no scope function configured"),
            "{w}"
        );
        assert!(matches!(
            awaiting_scope().scope(unset, ScopeResolution::NotCalled, false, "POST", "/p"),
            ScopeStage::Admitted(Admitted { warning: None, .. })
        ));
        assert_eq!(
            ScopeRule::new(true, true, false),
            Err(ScopeRuleError::PublicWithFunction)
        );
    }
}
