//! Response capture (`spec/PROTOCOL.md` §7.5): what a host keeps of the handler's response for
//! the record, and when it sends the response to the client.
//!
//! The host asks [`capture_plan`] once it knows the response's status and headers (before the
//! body), then, for [`CapturePlan::Tee`] and [`CapturePlan::Buffer`], feeds the length of each
//! body chunk to a [`BodyCapture`], which says whether the bytes are still recorded. At the end it
//! hands the flow a [`HandlerResponse`](super::HandlerResponse) whose `body` is what was recorded
//! and whose `body_truncated` is [`BodyCapture::truncated`]. A truncated (or too large) storable
//! response is completed with the `response-not-retained` problem ([`not_retained_response`]),
//! which every retry replays: never a key left in flight, never a 500 for the client that got
//! the response, never more than the limit held for the record.
use super::problem::{ProblemKind, problem_response};
use crate::policy::{Config, ResponseOrigin};
use crate::record::StoredResponse;

/// What the host does with a response's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum CapturePlan {
    /// The status is not stored: send the response as it comes and keep no bytes for the record
    /// (the body given to the flow may be empty; the live client gets the framework's response).
    PassThrough,
    /// Hold the response, record it (at most `limit` bytes, see [`BodyCapture`]) and send it
    /// once the flow answers `Respond`: the body is known to be small, or the route is
    /// transactional (its response may reach the client only after `COMMIT`, §7.6).
    Buffer {
        /// Largest recorded body (the policy's `max_body_bytes`).
        limit: usize,
    },
    /// Send each chunk to the client as it streams, and record the body while it stays within
    /// `limit` bytes (see [`BodyCapture`]); the record is written when the body ends.
    Tee {
        /// Largest recorded body (the policy's `max_body_bytes`).
        limit: usize,
    },
}

impl CapturePlan {
    /// Stable snake_case name (`pass_through`, `buffer`, `tee`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PassThrough => "pass_through",
            Self::Buffer { .. } => "buffer",
            Self::Tee { .. } => "tee",
        }
    }

    /// The recording limit (`None` for [`CapturePlan::PassThrough`]).
    #[must_use]
    pub fn limit(self) -> Option<usize> {
        match self {
            Self::PassThrough => None,
            Self::Buffer { limit } | Self::Tee { limit } => Some(limit),
        }
    }
}

/// Decides how the host captures a response of `status` from `origin` with these `headers`
/// (`content-length` is read when present and valid); `streaming` is the host's hint that the
/// body arrives in several parts (an ASGI `more_body`, a streaming or file response, a Node
/// stream or `res.write` before `res.end`).
///
/// In order: a status (or origin) the policy does not store is [`CapturePlan::PassThrough`]
/// (outside transactional mode); a transactional route is [`CapturePlan::Buffer`]; a response
/// that is not streamed and whose `content-length` is at most the limit is
/// [`CapturePlan::Buffer`]; anything else (streamed, no length, or longer than the limit) is
/// [`CapturePlan::Tee`].
pub fn capture_plan(
    config: &Config,
    status: u16,
    origin: ResponseOrigin,
    headers: &[(String, String)],
    streaming: bool,
) -> CapturePlan {
    let policy = &config.response;
    let limit = policy.max_body_bytes();
    if config.transactional {
        return CapturePlan::Buffer { limit };
    }
    if !policy.stores(status, origin) {
        return CapturePlan::PassThrough;
    }
    let length = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<u64>().ok());
    match length {
        Some(len) if !streaming && usize::try_from(len).is_ok_and(|l| l <= limit) => {
            CapturePlan::Buffer { limit }
        }
        _ => CapturePlan::Tee { limit },
    }
}

/// What the host does with the chunk it just fed to [`BodyCapture::accept`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum CaptureStep {
    /// Append the chunk to the recorded body.
    Record,
    /// The body went past the limit: drop what was recorded, record nothing more (the record
    /// will be the `response-not-retained` problem). Answered once; later chunks get
    /// [`CaptureStep::Skip`].
    Discard,
    /// Record nothing of this chunk (the limit was passed earlier).
    Skip,
}

/// Counts the body bytes of one response against the recording limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BodyCapture {
    limit: usize,
    seen: u64,
    truncated: bool,
}

impl BodyCapture {
    /// A capture that records at most `limit` bytes (see [`CapturePlan::limit`]).
    #[must_use]
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            seen: 0,
            truncated: false,
        }
    }

    /// Counts a chunk of `len` bytes and says what to do with it.
    pub fn accept(&mut self, len: usize) -> CaptureStep {
        self.seen = self
            .seen
            .saturating_add(u64::try_from(len).unwrap_or(u64::MAX));
        if self.truncated {
            return CaptureStep::Skip;
        }
        if usize::try_from(self.seen).is_ok_and(|s| s <= self.limit) {
            CaptureStep::Record
        } else {
            self.truncated = true;
            CaptureStep::Discard
        }
    }

    /// True once the body went past the limit (the host passes it as
    /// [`HandlerResponse::body_truncated`](super::HandlerResponse::body_truncated)).
    #[must_use]
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// Body bytes seen so far (recorded or not).
    #[must_use]
    pub fn seen(&self) -> u64 {
        self.seen
    }
}

/// The record stored for a storable response that cannot be retained (too large, or not
/// encodable): the 500 `response-not-retained` problem (`spec/PROTOCOL.md` §7.5), replayed to
/// every retry. The client that got the live response is not affected.
#[must_use]
pub fn not_retained_response() -> StoredResponse {
    let p = problem_response(ProblemKind::ResponseNotRetained, None, None, None);
    StoredResponse {
        status: p.status,
        headers: p.headers,
        body: p.body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{HeaderAllowlist, Redaction, ResponsePolicy};

    fn config(limit: usize, transactional: bool) -> Config {
        Config {
            response: ResponsePolicy::new(
                &[401, 409],
                false,
                limit,
                HeaderAllowlist::default(),
                Redaction::None,
            )
            .expect("valid"),
            transactional,
            ..Config::default()
        }
    }

    fn len(n: &str) -> Vec<(String, String)> {
        vec![("Content-Length".to_owned(), n.to_owned())]
    }

    #[test]
    fn plans() {
        let c = config(10, false);
        let h = ResponseOrigin::Handler;
        assert_eq!(
            capture_plan(&c, 401, h, &[], true),
            CapturePlan::PassThrough
        );
        assert_eq!(
            capture_plan(&c, 422, ResponseOrigin::Framework, &len("3"), false),
            CapturePlan::PassThrough
        );
        assert_eq!(
            capture_plan(&c, 500, h, &[], false),
            CapturePlan::PassThrough
        );
        assert_eq!(
            capture_plan(&c, 201, h, &len("10"), false),
            CapturePlan::Buffer { limit: 10 }
        );
        assert_eq!(
            capture_plan(&c, 201, h, &len("11"), false),
            CapturePlan::Tee { limit: 10 }
        );
        assert_eq!(
            capture_plan(&c, 201, h, &len("3"), true),
            CapturePlan::Tee { limit: 10 }
        );
        assert_eq!(
            capture_plan(&c, 201, h, &len("x"), false),
            CapturePlan::Tee { limit: 10 }
        );
        assert_eq!(
            capture_plan(&c, 201, h, &[], false),
            CapturePlan::Tee { limit: 10 }
        );
        let tx = config(10, true);
        for status in [201, 401, 500] {
            assert_eq!(
                capture_plan(&tx, status, h, &[], true),
                CapturePlan::Buffer { limit: 10 }
            );
        }
    }

    #[test]
    fn capture_stops_recording_past_the_limit() {
        let mut c = BodyCapture::new(5);
        assert_eq!(c.accept(3), CaptureStep::Record);
        assert_eq!(c.accept(2), CaptureStep::Record);
        assert!(!c.truncated());
        assert_eq!(c.accept(0), CaptureStep::Record);
        assert_eq!(c.accept(1), CaptureStep::Discard);
        assert!(c.truncated());
        assert_eq!(c.accept(1), CaptureStep::Skip);
        assert_eq!(c.accept(0), CaptureStep::Skip);
        assert_eq!(c.seen(), 7);
        let mut z = BodyCapture::new(0);
        assert_eq!(z.accept(0), CaptureStep::Record);
        assert_eq!(z.accept(1), CaptureStep::Discard);
    }

    #[test]
    fn not_retained_is_a_problem_record() {
        let r = not_retained_response();
        assert_eq!(r.status, 500);
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON");
        assert_eq!(v["type"], "urn:idempo:problem:response-not-retained");
        assert!(r.encode().is_ok());
    }

    #[test]
    fn plans_have_stable_names_and_their_limit() {
        assert_eq!(CapturePlan::PassThrough.as_str(), "pass_through");
        assert_eq!(CapturePlan::Buffer { limit: 7 }.as_str(), "buffer");
        assert_eq!(CapturePlan::Tee { limit: 7 }.as_str(), "tee");
        assert_eq!(CapturePlan::PassThrough.limit(), None);
        assert_eq!(CapturePlan::Buffer { limit: 7 }.limit(), Some(7));
        assert_eq!(CapturePlan::Tee { limit: 9 }.limit(), Some(9));
    }
}
