//! RFC 9457 problem+json answers for every response idempo makes itself.
//!
//! Bodies are `{"type", "title", "status", "detail"}` plus, for some kinds, a `code` extension
//! member; `Content-Type: application/problem+json`; `Retry-After` (delta-seconds, rounded up,
//! at least 1) on 409 and 503. Type URIs are `urn:idempo:problem:<slug>` (non-resolvable by
//! design; see `spec/PROTOCOL.md` §9).
use super::io::HttpResponse;
use crate::canonical::{CanonError, CanonErrorKind};
use crate::key::KeyError;

/// Prefix of every problem type URI.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:idempo:problem:";
/// Media type of problem bodies.
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";
/// Type URI of the outcome-unknown problem (`500`, `spec/PROTOCOL.md` §4.6): equal to
/// `ProblemKind::OutcomeUnknown.type_uri()`. Clients match it to stop retrying (see
/// [`crate::retry::AttemptOutcome::from_response`]).
pub const OUTCOME_UNKNOWN_TYPE: &str = "urn:idempo:problem:outcome-unknown";
/// Type URI of the response-not-retained problem (`500`, `spec/PROTOCOL.md` §7.5): equal to
/// `ProblemKind::ResponseNotRetained.type_uri()`.
pub const RESPONSE_NOT_RETAINED_TYPE: &str = "urn:idempo:problem:response-not-retained";
/// Type URI of the key-reused problem (`422`): equal to `ProblemKind::Mismatch.type_uri()`.
pub const KEY_REUSED_TYPE: &str = "urn:idempo:problem:key-reused";
/// Type URI of the in-flight problem (`409`): equal to `ProblemKind::InFlight.type_uri()`.
pub const IN_FLIGHT_TYPE: &str = "urn:idempo:problem:in-flight";

/// The problems idempo answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// 400: the route requires an `Idempotency-Key` and the request has none.
    MissingKey,
    /// 400: the `Idempotency-Key` value is malformed.
    InvalidKey,
    /// 400: the request body cannot be fingerprinted (e.g. malformed JSON).
    InvalidBody,
    /// 413: the request body exceeds the fingerprinting limits.
    BodyTooLarge,
    /// 409: another request with this key is being processed (live lease).
    InFlight,
    /// 422: the key was used for a different request.
    Mismatch,
    /// 500: an earlier execution under this key may have taken effect and its outcome was not
    /// recorded; retrying this key cannot change the answer until the record expires.
    OutcomeUnknown,
    /// 503: the idempotency store is unavailable; the handler did not run.
    StoreUnavailable,
    /// 503: the record kept changing under concurrent requests; the handler did not run.
    Contention,
    /// 500, stored as the record's response: the request was processed, but its response was
    /// too large (or could not be encoded) to keep for replays (`spec/PROTOCOL.md` §7.5).
    ResponseNotRetained,
    /// 500: the route's scope (principal) function gave nothing usable for this request, so the
    /// request was refused rather than filed under a namespace other users share
    /// (`spec/PROTOCOL.md` §7.2).
    ScopeUnresolved,
    /// 500: the request has a body, but the host cannot see its bytes (a body parser of the
    /// application read them first and kept none), so it cannot be fingerprinted; the request
    /// is refused rather than fingerprinted as empty (`spec/PROTOCOL.md` §7.2.1).
    BodyUnavailable,
}

impl ProblemKind {
    /// The HTTP status.
    #[must_use]
    pub fn status(self) -> u16 {
        match self {
            Self::MissingKey | Self::InvalidKey | Self::InvalidBody => 400,
            Self::BodyTooLarge => 413,
            Self::InFlight => 409,
            Self::Mismatch => 422,
            Self::OutcomeUnknown
            | Self::ResponseNotRetained
            | Self::ScopeUnresolved
            | Self::BodyUnavailable => 500,
            Self::StoreUnavailable | Self::Contention => 503,
        }
    }

    /// The stable slug (last part of the type URI).
    #[must_use]
    pub fn slug(self) -> &'static str {
        match self {
            Self::MissingKey => "missing-key",
            Self::InvalidKey => "invalid-key",
            Self::InvalidBody => "invalid-body",
            Self::BodyTooLarge => "body-too-large",
            Self::InFlight => "in-flight",
            Self::Mismatch => "key-reused",
            Self::OutcomeUnknown => "outcome-unknown",
            Self::StoreUnavailable => "store-unavailable",
            Self::Contention => "contention",
            Self::ResponseNotRetained => "response-not-retained",
            Self::ScopeUnresolved => "scope-unresolved",
            Self::BodyUnavailable => "body-unavailable",
        }
    }

    /// The type URI, `urn:idempo:problem:<slug>`.
    #[must_use]
    pub fn type_uri(self) -> String {
        format!("{PROBLEM_TYPE_PREFIX}{}", self.slug())
    }

    /// The short, fixed title.
    #[must_use]
    pub fn title(self) -> &'static str {
        match self {
            Self::MissingKey => "Idempotency-Key required",
            Self::InvalidKey => "Invalid Idempotency-Key",
            Self::InvalidBody => "Request body cannot be fingerprinted",
            Self::BodyTooLarge => "Request body too large",
            Self::InFlight => "Request in progress",
            Self::Mismatch => "Idempotency-Key reused for a different request",
            Self::OutcomeUnknown => "Outcome unknown",
            Self::StoreUnavailable => "Idempotency store unavailable",
            Self::Contention => "Idempotency key contended",
            Self::ResponseNotRetained => "Response not retained",
            Self::ScopeUnresolved => "Idempotency scope unresolved",
            Self::BodyUnavailable => "Request body unavailable",
        }
    }

    /// The default `detail`.
    #[must_use]
    pub fn default_detail(self) -> &'static str {
        match self {
            Self::MissingKey => "This endpoint requires an Idempotency-Key request header.",
            Self::InvalidKey => "The Idempotency-Key header value is not valid.",
            Self::InvalidBody => "The request body could not be canonicalized for fingerprinting.",
            Self::BodyTooLarge => "The request body exceeds the limits for fingerprinting.",
            Self::InFlight => {
                "A request with this Idempotency-Key is being processed. Retry after the indicated delay."
            }
            Self::Mismatch => {
                "This Idempotency-Key was already used for a different request. Use a new key for a new operation."
            }
            Self::OutcomeUnknown => {
                "An earlier attempt with this Idempotency-Key may have taken effect and its outcome was not recorded. Check the resource's state before using a new key."
            }
            Self::StoreUnavailable => {
                "The idempotency store is unavailable; the request was not processed. Retry with the same key."
            }
            Self::Contention => {
                "The idempotency record changed repeatedly under concurrent requests; the request was not processed. Retry with the same key."
            }
            Self::ResponseNotRetained => {
                "The request with this Idempotency-Key was processed, but its response was too large to keep for replays. Look the resource up instead of retrying; do not send it again with a new key."
            }
            Self::ScopeUnresolved => {
                "The server could not tell whose request this is (its idempotency scope function gave no principal); the request was not processed."
            }
            Self::BodyUnavailable => {
                "The server could not read this request's body bytes for idempotency processing (a body parser consumed them first); the request was not processed."
            }
        }
    }

    /// Whether the answer carries `Retry-After`.
    #[must_use]
    pub fn has_retry_after(self) -> bool {
        matches!(
            self,
            Self::InFlight | Self::StoreUnavailable | Self::Contention
        )
    }
}

/// `Retry-After` delta-seconds for a wait of `ms`: rounded up, at least 1.
#[must_use]
pub fn retry_after_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

/// Builds the problem response for `kind`.
///
/// `detail` replaces the default detail; `code` adds a `code` extension member (a stable
/// snake_case reason such as a key error code); `retry_after_ms` sets `Retry-After` (only
/// for kinds that carry one; ignored otherwise).
#[must_use]
pub fn problem_response(
    kind: ProblemKind,
    detail: Option<&str>,
    code: Option<&str>,
    retry_after_ms: Option<u64>,
) -> HttpResponse {
    let status = kind.status();
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":");
    push_json_string(&mut body, &kind.type_uri());
    body.push_str(",\"title\":");
    push_json_string(&mut body, kind.title());
    body.push_str(",\"status\":");
    body.push_str(&status.to_string());
    body.push_str(",\"detail\":");
    push_json_string(&mut body, detail.unwrap_or(kind.default_detail()));
    if let Some(code) = code {
        body.push_str(",\"code\":");
        push_json_string(&mut body, code);
    }
    body.push('}');
    let mut headers = vec![("content-type".to_owned(), PROBLEM_CONTENT_TYPE.to_owned())];
    if kind.has_retry_after() {
        if let Some(ms) = retry_after_ms {
            headers.push((
                "retry-after".to_owned(),
                retry_after_seconds(ms).to_string(),
            ));
        }
    }
    HttpResponse {
        status,
        headers,
        body: body.into_bytes(),
    }
}

/// 400 for a malformed `Idempotency-Key`, with the key error's message and code.
#[must_use]
pub fn invalid_key(err: &KeyError) -> HttpResponse {
    let detail = format!("The Idempotency-Key header value is not valid: {err}.");
    problem_response(
        ProblemKind::InvalidKey,
        Some(&detail),
        Some(err.code()),
        None,
    )
}

/// The problem kind for a request body the canonicalizer refused: `413` for the size limits
/// (input bytes, nesting depth, members per object), `400` for everything else.
#[must_use]
pub fn body_problem_kind(err: &CanonError) -> ProblemKind {
    match err.kind {
        CanonErrorKind::InputTooLarge { .. }
        | CanonErrorKind::DepthLimit { .. }
        | CanonErrorKind::TooManyMembers { .. } => ProblemKind::BodyTooLarge,
        _ => ProblemKind::InvalidBody,
    }
}

/// 400 or 413 (see [`body_problem_kind`]) for a request body that cannot be fingerprinted, with
/// the canonicalizer's code, byte offset and JSON Pointer in the detail. Hosts answer with this
/// instead of building their own mapping, so every binding says the same thing.
#[must_use]
pub fn invalid_body(err: &CanonError) -> HttpResponse {
    let kind = body_problem_kind(err);
    let detail = match &err.pointer {
        Some(pointer) => format!(
            "The request body cannot be fingerprinted: {} (at byte {}, JSON Pointer {pointer:?}).",
            err.kind, err.offset
        ),
        None => format!(
            "The request body cannot be fingerprinted: {} (at byte {}).",
            err.kind, err.offset
        ),
    };
    problem_response(kind, Some(&detail), Some(err.code()), None)
}

/// Appends `s` as a JSON string (RFC 8259 escaping; non-ASCII kept as UTF-8).
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_unknown_type_constant_matches_the_kind() {
        assert_eq!(ProblemKind::OutcomeUnknown.type_uri(), OUTCOME_UNKNOWN_TYPE);
        assert_eq!(
            ProblemKind::ResponseNotRetained.type_uri(),
            RESPONSE_NOT_RETAINED_TYPE
        );
        assert_eq!(ProblemKind::Mismatch.type_uri(), KEY_REUSED_TYPE);
        assert_eq!(ProblemKind::InFlight.type_uri(), IN_FLIGHT_TYPE);
    }

    #[test]
    fn body_is_valid_problem_json() {
        let r = problem_response(
            ProblemKind::InFlight,
            Some("quote \" backslash \\ ctl \u{1}"),
            Some("x"),
            Some(1_001),
        );
        assert_eq!(r.status, 409);
        assert_eq!(
            r.headers,
            vec![
                ("content-type".to_owned(), PROBLEM_CONTENT_TYPE.to_owned()),
                ("retry-after".to_owned(), "2".to_owned())
            ]
        );
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("valid JSON");
        assert_eq!(v["type"], "urn:idempo:problem:in-flight");
        assert_eq!(v["status"], 409);
        assert_eq!(v["detail"], "quote \" backslash \\ ctl \u{1}");
        assert_eq!(v["code"], "x");
        assert_eq!(v["title"], "Request in progress");
    }

    #[test]
    fn retry_after_only_where_it_belongs() {
        let r = problem_response(ProblemKind::Mismatch, None, None, Some(5_000));
        assert_eq!(r.headers.len(), 1);
        assert_eq!(retry_after_seconds(0), 1);
        assert_eq!(retry_after_seconds(1_000), 1);
        assert_eq!(retry_after_seconds(1_001), 2);
    }

    #[test]
    fn statuses_per_kind() {
        use ProblemKind::*;
        let all = [
            (MissingKey, 400),
            (InvalidKey, 400),
            (InvalidBody, 400),
            (BodyTooLarge, 413),
            (InFlight, 409),
            (Mismatch, 422),
            (OutcomeUnknown, 500),
            (StoreUnavailable, 503),
            (Contention, 503),
            (ResponseNotRetained, 500),
            (ScopeUnresolved, 500),
            (BodyUnavailable, 500),
        ];
        for (k, s) in all {
            assert_eq!(k.status(), s);
            let v: serde_json::Value =
                serde_json::from_slice(&problem_response(k, None, None, None).body)
                    .expect("valid JSON");
            assert_eq!(v["status"], s);
            assert_eq!(v["detail"], k.default_detail());
        }
    }

    #[test]
    fn invalid_key_carries_code() {
        let r = invalid_key(&KeyError::Empty);
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("valid JSON");
        assert_eq!(v["code"], "empty");
        assert_eq!(r.status, 400);
    }

    #[test]
    fn body_errors_map_to_400_or_413_with_code() {
        let too_deep = crate::canonical::canonicalize_with(
            b"[[[[1]]]]",
            &crate::canonical::CanonOptions {
                limits: crate::canonical::Limits {
                    max_depth: 2,
                    ..crate::canonical::Limits::default()
                },
                ..crate::canonical::CanonOptions::default()
            },
        )
        .expect_err("depth 4 > 2");
        let r = invalid_body(&too_deep);
        assert_eq!(r.status, 413);
        let body = String::from_utf8(r.body).expect("utf-8");
        assert!(body.contains("\"code\":\"depth_limit\""), "{body}");
        let dup = crate::canonical::canonicalize(br#"{"a":1,"\u0061":2}"#).expect_err("dup");
        let r = invalid_body(&dup);
        assert_eq!(r.status, 400);
        let body = String::from_utf8(r.body).expect("utf-8");
        assert!(body.contains("\"code\":\"duplicate_member\""), "{body}");
        assert!(body.contains("JSON Pointer"), "{body}");
    }

    /// Every kind has its own default `detail`, a sentence, and a problem response without a
    /// detail of its own carries it.
    #[test]
    fn each_kind_has_its_own_default_detail() {
        let kinds = [
            ProblemKind::MissingKey,
            ProblemKind::InvalidKey,
            ProblemKind::InvalidBody,
            ProblemKind::BodyTooLarge,
            ProblemKind::InFlight,
            ProblemKind::Mismatch,
            ProblemKind::OutcomeUnknown,
            ProblemKind::StoreUnavailable,
            ProblemKind::Contention,
            ProblemKind::ResponseNotRetained,
            ProblemKind::ScopeUnresolved,
            ProblemKind::BodyUnavailable,
        ];
        let details: std::collections::BTreeSet<&str> =
            kinds.iter().map(|k| k.default_detail()).collect();
        assert_eq!(details.len(), kinds.len(), "one detail per kind");
        for kind in kinds {
            let detail = kind.default_detail();
            assert!(
                detail.len() > 20 && detail.ends_with('.'),
                "{kind:?}: {detail:?}"
            );
            let body =
                String::from_utf8(problem_response(kind, None, None, None).body).expect("utf-8");
            assert!(body.contains(detail), "{kind:?}: {body}");
        }
        assert!(
            ProblemKind::MissingKey
                .default_detail()
                .contains("Idempotency-Key")
        );
    }
}
