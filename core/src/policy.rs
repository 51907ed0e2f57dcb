//! Per-route policy: lease and heartbeat, takeover, response caching, retention, key requirement.
//!
//! Every value has a documented default ([`Config::default`]); the values that have invariants
//! are built through validating constructors, so an invalid policy cannot exist at run time.
use std::num::{NonZeroU8, NonZeroU64, NonZeroUsize};

use thiserror::Error;

use crate::key::{KeyConfigError, KeyOptions};
use crate::record::is_valid_header_name;
use crate::vocab::ParseNameError;

/// Default lease: 30 s.
pub const DEFAULT_LEASE_MS: u64 = 30_000;
/// Default retention of a record: 24 h.
pub const DEFAULT_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// Default largest stored body: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// Default largest request body a host reads for a protected request: 1 MiB
/// (`spec/PROTOCOL.md` §7.2; larger bodies are answered 413).
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: usize = 1024 * 1024;
/// Default `Retry-After` hint for a 409 while another request holds the key: 1 s.
pub const DEFAULT_IN_FLIGHT_RETRY_AFTER_MS: u64 = 1_000;
/// Default `Retry-After` for a 503 (store unavailable or contention): 1 s.
pub const DEFAULT_UNAVAILABLE_RETRY_AFTER_MS: u64 = 1_000;
/// Default number of claim/get rounds before answering 503 contention.
pub const DEFAULT_MAX_STORE_ROUNDS: u8 = 3;
/// Default time a background cleanup keeps retrying (`spec/PROTOCOL.md` §7.4): 30 s.
pub const DEFAULT_CLEANUP_BUDGET_MS: u64 = 30_000;
/// Shortest lease accepted: 1 s (clock steps and store latency make shorter leases unsafe).
pub const MIN_LEASE_MS: u64 = 1_000;

/// Headers stored for replays unless configured otherwise.
pub const DEFAULT_STORED_HEADERS: &[&str] = &[
    "content-type",
    "content-language",
    "content-location",
    "location",
    "etag",
    "last-modified",
    "cache-control",
];

/// Headers that may never be stored, even when configured: credentials, cookies, hop-by-hop
/// fields, framing (the host recomputes it) and idempo's own replay marker.
pub const FORBIDDEN_STORED_HEADERS: &[&str] = &[
    "set-cookie",
    "set-cookie2",
    "cookie",
    "authorization",
    "proxy-authorization",
    "proxy-authenticate",
    "www-authenticate",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "date",
    "idempotent-replayed",
];

/// Statuses never stored by default (`spec/PROTOCOL.md` §9): answers that say the request did
/// not run, so a retry (typically the fixed request, same key) runs it: 401 Unauthorized,
/// 403 Forbidden, 407 Proxy Authentication Required, 408 Request Timeout, 409 Conflict,
/// 425 Too Early, 429 Too Many Requests.
pub const DEFAULT_TRANSIENT_STATUSES: &[u16] = &[401, 403, 407, 408, 409, 425, 429];

/// Headers stored with a recorded body whatever the allowlist: they change what the stored bytes
/// mean (`spec/PROTOCOL.md` §9), so a replay without them could not be decoded as the first
/// client decoded it.
pub const ALWAYS_STORED_HEADERS: &[&str] = &["content-encoding", "content-type", "vary"];

/// An invalid policy value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The lease is shorter than [`MIN_LEASE_MS`].
    #[error("lease of {0} ms is shorter than the minimum of 1000 ms")]
    LeaseTooShort(u64),
    /// The heartbeat interval is zero or not shorter than the lease.
    #[error("heartbeat interval {heartbeat_ms} ms must be > 0 and < the lease ({lease_ms} ms)")]
    BadHeartbeat {
        /// Configured heartbeat interval.
        heartbeat_ms: u64,
        /// Configured lease.
        lease_ms: u64,
    },
    /// The retention (`ttl_ms`) is not longer than the lease: a crashed request's record would
    /// expire with its lease, so no takeover policy could ever apply (`spec/MODEL.md` §4.4).
    #[error(
        "ttl_ms ({ttl_ms} ms) must be longer than lease_ms ({lease_ms} ms): a record that expires \
         with its lease makes a crashed request run again at the lease's end whatever the takeover \
         policy; raise ttl_ms or shorten lease_ms"
    )]
    TtlNotAboveLease {
        /// Configured retention.
        ttl_ms: u64,
        /// Configured lease.
        lease_ms: u64,
    },
    /// A header name is not an RFC 9110 token.
    #[error("{0:?} is not a valid header name")]
    InvalidHeaderName(String),
    /// A header that may never be stored (credentials, cookies, hop-by-hop) was allow-listed.
    #[error("header {0:?} may never be stored for replays")]
    ForbiddenHeader(String),
    /// A status outside 100..=599 was listed.
    #[error("status {0} is outside 100..=599")]
    InvalidStatus(u16),
    /// An option that must be positive is zero.
    #[error("{0} must be positive")]
    NotPositive(&'static str),
    /// An option is larger than its type or its bound allows.
    #[error("{option} must be at most {max}, got {value}")]
    TooLarge {
        /// The option's name (snake_case, as in [`ConfigOptions`]).
        option: &'static str,
        /// The value given.
        value: u64,
        /// The largest accepted value.
        max: u64,
    },
    /// The key syntax options are inconsistent.
    #[error("key options: {0}")]
    Key(#[from] KeyConfigError),
    /// A named value (takeover policy, ...) is not one of the accepted names.
    #[error(transparent)]
    Name(#[from] ParseNameError),
}

impl ConfigError {
    /// Stable snake_case code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::LeaseTooShort(_) => "lease_too_short",
            Self::BadHeartbeat { .. } => "bad_heartbeat",
            Self::TtlNotAboveLease { .. } => "ttl_not_above_lease",
            Self::InvalidHeaderName(_) => "invalid_header_name",
            Self::ForbiddenHeader(_) => "forbidden_header",
            Self::InvalidStatus(_) => "invalid_status",
            Self::NotPositive(_) => "not_positive",
            Self::TooLarge { .. } => "too_large",
            Self::Key(e) => e.code(),
            Self::Name(_) => "invalid_name",
        }
    }
}

/// Lease length and heartbeat of in-progress records.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeasePolicy {
    lease_ms: u64,
    heartbeat_ms: Option<u64>,
}

impl LeasePolicy {
    /// A lease of `lease_ms` (≥ 1 s), renewed every `heartbeat_ms` while the handler runs
    /// (`None`: never renewed, so the handler must finish within the lease).
    pub fn new(lease_ms: u64, heartbeat_ms: Option<u64>) -> Result<Self, ConfigError> {
        if lease_ms < MIN_LEASE_MS {
            return Err(ConfigError::LeaseTooShort(lease_ms));
        }
        if let Some(hb) = heartbeat_ms {
            if hb == 0 || hb >= lease_ms {
                return Err(ConfigError::BadHeartbeat {
                    heartbeat_ms: hb,
                    lease_ms,
                });
            }
        }
        Ok(Self {
            lease_ms,
            heartbeat_ms,
        })
    }

    /// A lease of `lease_ms` with a heartbeat every third of it.
    pub fn with_default_heartbeat(lease_ms: u64) -> Result<Self, ConfigError> {
        Self::new(lease_ms, Some(lease_ms / 3))
    }

    /// The lease length in ms.
    #[must_use]
    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    /// The heartbeat interval in ms, if heartbeats are on.
    #[must_use]
    pub fn heartbeat_ms(&self) -> Option<u64> {
        self.heartbeat_ms
    }
}

impl Default for LeasePolicy {
    /// 30 s lease, heartbeat every 10 s.
    fn default() -> Self {
        Self {
            lease_ms: DEFAULT_LEASE_MS,
            heartbeat_ms: Some(DEFAULT_LEASE_MS / 3),
        }
    }
}

/// What a request does with an `InProgress` record whose lease has expired (its owner crashed,
/// paused or was partitioned away).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TakeoverPolicy {
    /// Take the key over with a new fencing token and run the handler again. Choose this when the
    /// side effect commits in the store's transaction or is keyed downstream with the generation's
    /// downstream key; for an unkeyed external effect it gives an at-least-once window.
    ReRun,
    /// Mark the record outcome-unknown (terminal until it expires) and answer every retry with the
    /// outcome-unknown problem: the handler runs at most once per generation.
    #[default]
    OutcomeUnknown,
}

/// Whether a route requires the `Idempotency-Key` header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KeyRequirement {
    /// A request without a key is answered 400 (missing-key problem).
    #[default]
    Required,
    /// A request without a key runs the handler without idempotency protection.
    Optional,
}

/// Where the host applies its redaction hook to a response before it is stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Redaction {
    /// Store the body exactly as the handler returned it.
    #[default]
    None,
    /// The host calls its redaction hook and passes the result as
    /// [`HandlerResponse::body_to_store`](crate::machine::HandlerResponse::body_to_store); the
    /// flow then stores that copy and replays it, while the live client gets the original body.
    HostHook,
}

/// A validated list of header names stored for replays (lowercase, no forbidden names).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HeaderAllowlist {
    names: Vec<String>,
}

impl HeaderAllowlist {
    /// Validates `names` (case-insensitive); forbidden names are a [`ConfigError::ForbiddenHeader`].
    pub fn new<I, S>(names: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut out: Vec<String> = Vec::new();
        for name in names {
            let name = name.as_ref();
            if !is_valid_header_name(name) {
                return Err(ConfigError::InvalidHeaderName(name.to_owned()));
            }
            let lower = name.to_ascii_lowercase();
            if FORBIDDEN_STORED_HEADERS.contains(&lower.as_str()) {
                return Err(ConfigError::ForbiddenHeader(lower));
            }
            if !out.contains(&lower) {
                out.push(lower);
            }
        }
        out.sort();
        Ok(Self { names: out })
    }

    /// True when a header of this name is stored (case-insensitive).
    #[must_use]
    pub fn allows(&self, name: &str) -> bool {
        self.names.iter().any(|n| n.eq_ignore_ascii_case(name))
    }

    /// The lowercase names, sorted.
    #[must_use]
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

impl Default for HeaderAllowlist {
    /// [`DEFAULT_STORED_HEADERS`].
    fn default() -> Self {
        let mut names: Vec<String> = DEFAULT_STORED_HEADERS
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        names.sort();
        Self { names }
    }
}

/// Who produced a response the host hands to the flow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ResponseOrigin {
    /// The route's handler ran and returned it (the default).
    #[default]
    Handler,
    /// The web framework rejected the request before the handler ran (e.g. FastAPI's request
    /// validation 422, Fastify's schema validation 400). Never stored, whatever its status: the
    /// request did not run, so the corrected request with the same key must run.
    Framework,
}

impl ResponseOrigin {
    /// Stable snake_case name (`handler`, `framework`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Handler => "handler",
            Self::Framework => "framework",
        }
    }
}

/// Which handler responses are stored for replays, and how.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResponsePolicy {
    transient: Vec<u16>,
    store_server_errors: bool,
    max_body_bytes: usize,
    headers: HeaderAllowlist,
    redaction: Redaction,
}

/// What the policy says about one handler response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum StoreVerdict {
    /// Store it (complete the record).
    Store,
    /// Not stored: release the key so a retry runs the handler again.
    Release,
    /// Storable by status but the body exceeds the size cap: the record is completed with the
    /// `response-not-retained` problem instead (`spec/PROTOCOL.md` §7.5.1).
    TooLarge,
}

impl ResponsePolicy {
    /// Builds a policy. `transient` lists statuses never stored (a retry re-runs);
    /// `store_server_errors` stores 5xx (except 503) as Stripe does, instead of releasing the key.
    pub fn new(
        transient: &[u16],
        store_server_errors: bool,
        max_body_bytes: usize,
        headers: HeaderAllowlist,
        redaction: Redaction,
    ) -> Result<Self, ConfigError> {
        let mut t = Vec::with_capacity(transient.len());
        for &s in transient {
            if !(100..=599).contains(&s) {
                return Err(ConfigError::InvalidStatus(s));
            }
            if !t.contains(&s) {
                t.push(s);
            }
        }
        t.sort_unstable();
        Ok(Self {
            transient: t,
            store_server_errors,
            max_body_bytes,
            headers,
            redaction,
        })
    }

    /// True when a response with this status is stored (size aside).
    ///
    /// Stored: 200..=499 except the transient list; 500..=599 except 503 only with
    /// `store_server_errors`. Never: 1xx (not final) and anything outside 100..=599.
    #[must_use]
    pub fn stores_status(&self, status: u16) -> bool {
        if self.transient.contains(&status) {
            return false;
        }
        match status {
            200..=499 => true,
            503 => false,
            500..=599 => self.store_server_errors,
            _ => false,
        }
    }

    /// True when a response of `status` from `origin` is stored (size aside): never for a
    /// [`ResponseOrigin::Framework`] response, else [`ResponsePolicy::stores_status`].
    #[must_use]
    pub fn stores(&self, status: u16, origin: ResponseOrigin) -> bool {
        origin == ResponseOrigin::Handler && self.stores_status(status)
    }

    /// True when a response header of this name is stored with the body: allow-listed, or one of
    /// [`ALWAYS_STORED_HEADERS`] (case-insensitive).
    #[must_use]
    pub fn stores_header(&self, name: &str) -> bool {
        self.headers.allows(name)
            || ALWAYS_STORED_HEADERS
                .iter()
                .any(|h| h.eq_ignore_ascii_case(name))
    }

    /// The verdict for a handler response of `status` whose stored body has `body_len` bytes.
    pub fn verdict(&self, status: u16, body_len: usize) -> StoreVerdict {
        self.verdict_from(status, ResponseOrigin::Handler, body_len)
    }

    /// The verdict for a response of `status` from `origin` whose stored body has `body_len`
    /// bytes (`spec/PROTOCOL.md` §9).
    pub fn verdict_from(
        &self,
        status: u16,
        origin: ResponseOrigin,
        body_len: usize,
    ) -> StoreVerdict {
        if !self.stores(status, origin) {
            StoreVerdict::Release
        } else if body_len > self.max_body_bytes {
            StoreVerdict::TooLarge
        } else {
            StoreVerdict::Store
        }
    }

    /// Statuses never stored.
    #[must_use]
    pub fn transient(&self) -> &[u16] {
        &self.transient
    }

    /// Whether 5xx (other than 503) are stored.
    #[must_use]
    pub fn store_server_errors(&self) -> bool {
        self.store_server_errors
    }

    /// Largest stored body in bytes.
    #[must_use]
    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    /// The header allowlist.
    #[must_use]
    pub fn headers(&self) -> &HeaderAllowlist {
        &self.headers
    }

    /// Where redaction happens.
    #[must_use]
    pub fn redaction(&self) -> Redaction {
        self.redaction
    }
}

impl Default for ResponsePolicy {
    /// 2xx–4xx except 401/403/407/408/409/425/429 stored, 5xx released, 1 MiB cap, default
    /// header allowlist, no redaction.
    fn default() -> Self {
        Self {
            transient: DEFAULT_TRANSIENT_STATUSES.to_vec(),
            store_server_errors: false,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            headers: HeaderAllowlist::default(),
            redaction: Redaction::None,
        }
    }
}

/// The complete per-route configuration of the key state machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    /// Lease and heartbeat.
    pub lease: LeasePolicy,
    /// What to do with an expired lease.
    pub takeover: TakeoverPolicy,
    /// Which responses are stored.
    pub response: ResponsePolicy,
    /// Retention of a record after completion or outcome-unknown (and at least the lease while
    /// in progress). Default 24 h.
    pub ttl_ms: NonZeroU64,
    /// Whether the route requires a key. Default required.
    pub key: KeyRequirement,
    /// `Retry-After` hint (ms) on a 409; the flow sends the smaller of this and the lease left.
    pub in_flight_retry_after_ms: NonZeroU64,
    /// `Retry-After` (ms) on a 503 (store unavailable, contention).
    pub unavailable_retry_after_ms: NonZeroU64,
    /// Store rounds (claim, get, takeover, mark-unknown) before the flow gives up with 503
    /// contention. Default 3.
    pub max_store_rounds: NonZeroU8,
    /// Transactional mode (`spec/PROTOCOL.md` §7.6): the host runs every store operation of the
    /// flow, and the handler's writes, in one database transaction. The flow then asks for no
    /// heartbeat, rolls back (release) on a handler error, ends a recorded outcome with
    /// [`StoreOp::Commit`](crate::machine::StoreOp::Commit), and sends the handler's response
    /// only once its writes committed (or were rolled back with a status that is not stored).
    /// Default false.
    pub transactional: bool,
    /// How long (ms from its first attempt) the background cleanup of a lost claim or takeover
    /// keeps retrying (`spec/PROTOCOL.md` §7.4); the effective budget is the larger of this and
    /// the lease, since a store that froze may apply the lost write only once it resumes.
    /// Default [`DEFAULT_CLEANUP_BUDGET_MS`] (30 s).
    pub cleanup_budget_ms: NonZeroU64,
    /// Key syntax (lengths, strict sf-string form) used by admission (`spec/KEYS.md` §1).
    /// Default [`KeyOptions::default`].
    pub key_options: KeyOptions,
    /// Largest request body admission accepts (`spec/PROTOCOL.md` §7.2): a longer body is
    /// answered 413 `body-too-large`. Default [`DEFAULT_MAX_REQUEST_BODY_BYTES`] (1 MiB).
    pub max_request_body_bytes: NonZeroUsize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            lease: LeasePolicy::default(),
            takeover: TakeoverPolicy::default(),
            response: ResponsePolicy::default(),
            ttl_ms: nz64(DEFAULT_TTL_MS),
            key: KeyRequirement::default(),
            in_flight_retry_after_ms: nz64(DEFAULT_IN_FLIGHT_RETRY_AFTER_MS),
            unavailable_retry_after_ms: nz64(DEFAULT_UNAVAILABLE_RETRY_AFTER_MS),
            max_store_rounds: NonZeroU8::new(DEFAULT_MAX_STORE_ROUNDS).unwrap_or(NonZeroU8::MIN),
            transactional: false,
            cleanup_budget_ms: nz64(DEFAULT_CLEANUP_BUDGET_MS),
            key_options: KeyOptions::default(),
            max_request_body_bytes: NonZeroUsize::new(DEFAULT_MAX_REQUEST_BODY_BYTES)
                .unwrap_or(NonZeroUsize::MIN),
        }
    }
}

fn nz64(v: u64) -> NonZeroU64 {
    NonZeroU64::new(v).unwrap_or(NonZeroU64::MIN)
}

/// The flat option set every binding exposes, verbatim (snake_case in Rust and Python, the
/// mechanical camelCase in Node): each `None` takes [`Config::default`]'s value, and
/// [`ConfigOptions::build`] validates the whole set into a [`Config`].
///
/// `heartbeat_ms = Some(0)` turns heartbeats off (the handler must then finish within the lease);
/// `None` renews every third of the lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigOptions {
    /// Lease length in ms (at least [`MIN_LEASE_MS`]).
    pub lease_ms: Option<u64>,
    /// Heartbeat interval in ms, below the lease; 0: no heartbeat; default a third of the lease.
    pub heartbeat_ms: Option<u64>,
    /// What an expired lease leads to (named `"outcome_unknown"` or `"re_run"`).
    pub takeover: Option<TakeoverPolicy>,
    /// Record retention in ms.
    pub ttl_ms: Option<u64>,
    /// Whether a request without a key is refused (400); false runs it unprotected.
    pub key_required: Option<bool>,
    /// Shortest key accepted, in characters.
    pub key_min_len: Option<usize>,
    /// Longest key accepted, in characters (at most 255).
    pub key_max_len: Option<usize>,
    /// Accept only the draft sf-string key form.
    pub key_strict: Option<bool>,
    /// Statuses never stored (a retry re-runs).
    pub transient_statuses: Option<Vec<u16>>,
    /// Store 5xx responses (except 503) instead of releasing the key.
    pub store_server_errors: Option<bool>,
    /// Largest response body stored for replays, bytes.
    pub max_stored_body_bytes: Option<usize>,
    /// Response headers stored and replayed.
    pub stored_headers: Option<Vec<String>>,
    /// The host's redaction hook supplies the stored body.
    pub redact: Option<bool>,
    /// `Retry-After` hint on a 409, ms.
    pub in_flight_retry_after_ms: Option<u64>,
    /// `Retry-After` on a 503, ms.
    pub unavailable_retry_after_ms: Option<u64>,
    /// Store rounds before 503 contention (1..=255).
    pub max_store_rounds: Option<u64>,
    /// How long the background cleanup of a lost claim keeps retrying, ms.
    pub cleanup_budget_ms: Option<u64>,
    /// Largest request body admission accepts, bytes.
    pub max_request_body_bytes: Option<usize>,
    /// Transactional mode (`spec/PROTOCOL.md` §7.6).
    pub transactional: Option<bool>,
}

impl ConfigOptions {
    /// The option names, snake_case, in declaration order (bindings derive their spelling).
    pub const NAMES: &'static [&'static str] = &[
        "lease_ms",
        "heartbeat_ms",
        "takeover",
        "ttl_ms",
        "key_required",
        "key_min_len",
        "key_max_len",
        "key_strict",
        "transient_statuses",
        "store_server_errors",
        "max_stored_body_bytes",
        "stored_headers",
        "redact",
        "in_flight_retry_after_ms",
        "unavailable_retry_after_ms",
        "max_store_rounds",
        "cleanup_budget_ms",
        "max_request_body_bytes",
        "transactional",
    ];

    /// Validates the options; every absent one takes [`Config::default`]'s value.
    ///
    /// # Errors
    /// The first invalid option, as a [`ConfigError`].
    pub fn build(&self) -> Result<Config, ConfigError> {
        let d = Config::default();
        let lease_ms = self.lease_ms.unwrap_or(d.lease.lease_ms());
        let lease = match self.heartbeat_ms {
            None => LeasePolicy::with_default_heartbeat(lease_ms),
            Some(0) => LeasePolicy::new(lease_ms, None),
            Some(hb) => LeasePolicy::new(lease_ms, Some(hb)),
        }?;
        let headers = match &self.stored_headers {
            None => d.response.headers().clone(),
            Some(names) => HeaderAllowlist::new(names)?,
        };
        let response = ResponsePolicy::new(
            self.transient_statuses
                .as_deref()
                .unwrap_or(d.response.transient()),
            self.store_server_errors
                .unwrap_or(d.response.store_server_errors()),
            self.max_stored_body_bytes
                .unwrap_or(d.response.max_body_bytes()),
            headers,
            if self.redact.unwrap_or(false) {
                Redaction::HostHook
            } else {
                Redaction::None
            },
        )?;
        let key_options = KeyOptions::new(
            self.key_min_len.unwrap_or(d.key_options.min_len()),
            self.key_max_len.unwrap_or(d.key_options.max_len()),
        )?
        .with_strict(self.key_strict.unwrap_or(d.key_options.is_strict()));
        let pos = |v: Option<u64>, name: &'static str, default: NonZeroU64| match v {
            None => Ok(default),
            Some(v) => NonZeroU64::new(v).ok_or(ConfigError::NotPositive(name)),
        };
        let max_store_rounds = match self.max_store_rounds {
            None => d.max_store_rounds,
            Some(v) => {
                let small = u8::try_from(v).map_err(|_| ConfigError::TooLarge {
                    option: "max_store_rounds",
                    value: v,
                    max: u64::from(u8::MAX),
                })?;
                NonZeroU8::new(small).ok_or(ConfigError::NotPositive("max_store_rounds"))?
            }
        };
        let ttl_ms = pos(self.ttl_ms, "ttl_ms", d.ttl_ms)?;
        if ttl_ms.get() <= lease.lease_ms() {
            return Err(ConfigError::TtlNotAboveLease {
                ttl_ms: ttl_ms.get(),
                lease_ms: lease.lease_ms(),
            });
        }
        Ok(Config {
            lease,
            takeover: self.takeover.unwrap_or(d.takeover),
            response,
            ttl_ms,
            key: match self.key_required {
                None => d.key,
                Some(true) => KeyRequirement::Required,
                Some(false) => KeyRequirement::Optional,
            },
            in_flight_retry_after_ms: pos(
                self.in_flight_retry_after_ms,
                "in_flight_retry_after_ms",
                d.in_flight_retry_after_ms,
            )?,
            unavailable_retry_after_ms: pos(
                self.unavailable_retry_after_ms,
                "unavailable_retry_after_ms",
                d.unavailable_retry_after_ms,
            )?,
            max_store_rounds,
            transactional: self.transactional.unwrap_or(d.transactional),
            cleanup_budget_ms: pos(
                self.cleanup_budget_ms,
                "cleanup_budget_ms",
                d.cleanup_budget_ms,
            )?,
            key_options,
            max_request_body_bytes: match self.max_request_body_bytes {
                None => d.max_request_body_bytes,
                Some(v) => NonZeroUsize::new(v)
                    .ok_or(ConfigError::NotPositive("max_request_body_bytes"))?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_options_build_the_default_config() {
        assert_eq!(ConfigOptions::default().build(), Ok(Config::default()));
    }

    #[test]
    fn options_validate_with_typed_errors() {
        let o = |f: fn(&mut ConfigOptions)| {
            let mut o = ConfigOptions::default();
            f(&mut o);
            o.build()
        };
        assert_eq!(
            o(|o| o.ttl_ms = Some(0)),
            Err(ConfigError::NotPositive("ttl_ms"))
        );
        assert_eq!(
            o(|o| o.max_request_body_bytes = Some(0)),
            Err(ConfigError::NotPositive("max_request_body_bytes"))
        );
        assert!(matches!(
            o(|o| o.max_store_rounds = Some(256)),
            Err(ConfigError::TooLarge { .. })
        ));
        assert!(matches!(
            o(|o| {
                o.key_min_len = Some(20);
                o.key_max_len = Some(10);
            }),
            Err(ConfigError::Key(_))
        ));
        // spec/MODEL.md §4.4: a retention no longer than the lease makes every takeover policy moot.
        assert_eq!(
            o(|o| {
                o.lease_ms = Some(30_000);
                o.ttl_ms = Some(30_000);
            }),
            Err(ConfigError::TtlNotAboveLease {
                ttl_ms: 30_000,
                lease_ms: 30_000
            })
        );
        assert!(matches!(
            o(|o| o.ttl_ms = Some(10_000)),
            Err(ConfigError::TtlNotAboveLease {
                lease_ms: 30_000,
                ..
            })
        ));
        assert!(
            o(|o| {
                o.lease_ms = Some(5_000);
                o.ttl_ms = Some(5_001);
            })
            .is_ok()
        );
        let c = o(|o| {
            o.heartbeat_ms = Some(0);
            o.key_strict = Some(true);
            o.transactional = Some(true);
        })
        .expect("valid");
        assert_eq!(c.lease.heartbeat_ms(), None);
        assert!(c.key_options.is_strict() && c.transactional);
    }

    #[test]
    fn lease_validation() {
        assert_eq!(
            LeasePolicy::new(999, None),
            Err(ConfigError::LeaseTooShort(999))
        );
        assert!(LeasePolicy::new(1_000, None).is_ok());
        assert!(matches!(
            LeasePolicy::new(5_000, Some(5_000)),
            Err(ConfigError::BadHeartbeat { .. })
        ));
        assert!(matches!(
            LeasePolicy::new(5_000, Some(0)),
            Err(ConfigError::BadHeartbeat { .. })
        ));
        let p = LeasePolicy::with_default_heartbeat(9_000).expect("valid");
        assert_eq!((p.lease_ms(), p.heartbeat_ms()), (9_000, Some(3_000)));
        let d = LeasePolicy::default();
        assert_eq!((d.lease_ms(), d.heartbeat_ms()), (30_000, Some(10_000)));
    }

    #[test]
    fn allowlist_refuses_forbidden_headers_in_any_case() {
        for bad in [
            "Set-Cookie",
            "AUTHORIZATION",
            "transfer-encoding",
            "Connection",
        ] {
            assert!(
                matches!(
                    HeaderAllowlist::new([bad]),
                    Err(ConfigError::ForbiddenHeader(_))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            HeaderAllowlist::new(["bad name"]),
            Err(ConfigError::InvalidHeaderName(_))
        ));
        let a = HeaderAllowlist::new(["ETag", "x-request-id", "etag"]).expect("valid");
        assert_eq!(a.names(), ["etag", "x-request-id"]);
        assert!(a.allows("ETAG"));
        assert!(!a.allows("content-type"));
        let d = HeaderAllowlist::default();
        for h in DEFAULT_STORED_HEADERS {
            assert!(d.allows(h));
            assert!(!FORBIDDEN_STORED_HEADERS.contains(h));
        }
    }

    #[test]
    fn default_status_policy() {
        let p = ResponsePolicy::default();
        for s in [200, 201, 204, 303, 400, 402, 404, 410, 422] {
            assert!(p.stores_status(s), "{s} stored");
            assert!(p.stores(s, ResponseOrigin::Handler), "{s} stored");
            assert!(
                !p.stores(s, ResponseOrigin::Framework),
                "framework {s} released"
            );
        }
        for s in [
            100, 101, 401, 403, 407, 408, 409, 425, 429, 500, 502, 503, 504, 600,
        ] {
            assert!(!p.stores_status(s), "{s} not stored");
        }
        assert_eq!(
            p.verdict_from(422, ResponseOrigin::Framework, 0),
            StoreVerdict::Release
        );
        for h in ["Content-Encoding", "vary", "content-type"] {
            assert!(p.stores_header(h), "{h}");
        }
        assert!(!p.stores_header("x-trace"));
        assert_eq!(p.verdict(201, DEFAULT_MAX_BODY_BYTES), StoreVerdict::Store);
        assert_eq!(
            p.verdict(201, DEFAULT_MAX_BODY_BYTES + 1),
            StoreVerdict::TooLarge
        );
        assert_eq!(p.verdict(500, 10), StoreVerdict::Release);
    }

    #[test]
    fn stripe_like_policy_stores_server_errors_but_not_503() {
        let p = ResponsePolicy::new(
            &[409, 429],
            true,
            10,
            HeaderAllowlist::default(),
            Redaction::None,
        )
        .expect("valid");
        assert!(p.stores_status(500));
        assert!(p.stores_status(408));
        assert!(!p.stores_status(503));
        assert!(!p.stores_status(409));
        assert_eq!(p.verdict(500, 11), StoreVerdict::TooLarge);
        assert_eq!(
            ResponsePolicy::new(&[42], false, 1, HeaderAllowlist::default(), Redaction::None),
            Err(ConfigError::InvalidStatus(42))
        );
    }

    /// The defaults `spec/PROTOCOL.md` documents (§6 the lease, §7.2 the request body, §9 what is
    /// stored and for how long), written out: the constants they come from are checked against
    /// the spec's figures, not against themselves.
    #[test]
    fn defaults_are_the_documented_figures() {
        let c = Config::default();
        assert_eq!(c.ttl_ms.get(), 86_400_000, "TTL 24 h");
        assert_eq!(c.lease.lease_ms(), 30_000, "lease 30 s");
        assert_eq!(c.lease.heartbeat_ms(), Some(10_000), "a third of the lease");
        assert_eq!(
            c.max_request_body_bytes.get(),
            1_048_576,
            "request body 1 MiB"
        );
        assert_eq!(c.response.max_body_bytes(), 1_048_576, "stored body 1 MiB");
        assert!(!c.response.store_server_errors(), "5xx released");
        assert_eq!(c.response.redaction(), Redaction::None);
        assert_eq!(c.response.headers(), &HeaderAllowlist::default());
        assert_eq!(c.in_flight_retry_after_ms.get(), 1_000);
        assert_eq!(c.unavailable_retry_after_ms.get(), 1_000);
        assert_eq!(c.cleanup_budget_ms.get(), 30_000);
        assert!(!c.transactional);
    }

    #[test]
    fn a_response_policy_reads_back_what_it_was_built_with() {
        let headers = HeaderAllowlist::new(["Location", "x-request-id"]).expect("valid");
        let p = ResponsePolicy::new(&[429], true, 64, headers.clone(), Redaction::HostHook)
            .expect("valid");
        assert!(p.store_server_errors());
        assert_eq!(p.max_body_bytes(), 64);
        assert_eq!(p.headers(), &headers);
        assert!(p.headers().allows("location"));
        assert_eq!(p.redaction(), Redaction::HostHook);
    }

    /// The codes the bindings raise as their typed errors' `code` (Python `ConfigError.code`,
    /// Node `err.code`): stable snake_case, one per variant.
    #[test]
    fn config_error_codes_are_stable() {
        let cases = [
            (ConfigError::LeaseTooShort(10), "lease_too_short"),
            (
                ConfigError::BadHeartbeat {
                    heartbeat_ms: 0,
                    lease_ms: 30_000,
                },
                "bad_heartbeat",
            ),
            (
                ConfigError::TtlNotAboveLease {
                    ttl_ms: 1_000,
                    lease_ms: 30_000,
                },
                "ttl_not_above_lease",
            ),
            (
                ConfigError::InvalidHeaderName("a b".into()),
                "invalid_header_name",
            ),
            (
                ConfigError::ForbiddenHeader("cookie".into()),
                "forbidden_header",
            ),
            (ConfigError::InvalidStatus(42), "invalid_status"),
            (ConfigError::NotPositive("ttl_ms"), "not_positive"),
            (
                ConfigError::TooLarge {
                    option: "lease_ms",
                    value: 2,
                    max: 1,
                },
                "too_large",
            ),
            (
                ConfigError::Name(ParseNameError {
                    what: "takeover",
                    got: "rerun".into(),
                    accepted: &["outcome_unknown", "re_run"],
                    hint: None,
                }),
                "invalid_name",
            ),
        ];
        for (err, code) in cases {
            assert_eq!(err.code(), code, "{err}");
        }
    }

    #[test]
    fn response_origins_have_stable_names() {
        assert_eq!(ResponseOrigin::Handler.as_str(), "handler");
        assert_eq!(ResponseOrigin::Framework.as_str(), "framework");
    }
}
