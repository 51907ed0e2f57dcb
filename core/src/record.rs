//! The stored record: one row per scope key, shared by every store and every host language.
//!
//! A [`Record`] is what the storage contract (`spec/STORAGE.md`) keeps under a 32-byte scope key:
//! the request [fingerprint](FingerprintText), the fencing [token](FencingToken), the
//! [generation](Record::generation), the expiry and a [`RecordState`]. Stores exchange it with core
//! as a [`RecordRow`] (the column values, exactly as a SQL row or a Redis hash holds them), converted
//! with [`Record::from_row`] and [`Record::to_row`].
//!
//! The `response` column holds a [`StoredResponse`] in a versioned binary encoding defined here
//! ([`StoredResponse::encode`] / [`StoredResponse::decode`]), so a Python and a Node service can
//! share one table.
//!
//! ## Response encoding, version 1
//!
//! All integers are unsigned big-endian.
//!
//! | field | size | value |
//! |---|---|---|
//! | magic | 3 | `69 64 72` (`"idr"`) |
//! | version | 1 | `01` |
//! | status | 2 | 100..=599 |
//! | header count | 2 | n |
//! | n × header | 2 + len + 4 + len | name length, name (an RFC 9110 token), value length, value (UTF-8, no control characters except tab) |
//! | body length | 4 | m |
//! | body | m | bytes |
//!
//! Nothing may follow the body. Decoding never panics and never allocates more than the input size.
use std::fmt;

use subtle::ConstantTimeEq;
use thiserror::Error;

/// Magic prefix of an encoded [`StoredResponse`] (`"idr"`).
pub const RESPONSE_MAGIC: [u8; 3] = *b"idr";
/// The response encoding version written by [`StoredResponse::encode`].
pub const RESPONSE_VERSION: u8 = 1;
/// Longest accepted fingerprint text, in bytes.
pub const MAX_FINGERPRINT_LEN: usize = 200;
/// Highest generation a record may carry (the `generation` column is a signed 32-bit `INTEGER`).
pub const MAX_GENERATION: u32 = i32::MAX as u32;

/// State code of an in-progress record in the `state` column.
pub const STATE_IN_PROGRESS: i64 = 1;
/// State code of a completed record in the `state` column.
pub const STATE_COMPLETED: i64 = 2;
/// State code of an outcome-unknown record in the `state` column.
pub const STATE_OUTCOME_UNKNOWN: i64 = 3;

/// A request fingerprint as the store keeps it (the `fingerprint` column, e.g. `v1:<64 hex>`).
///
/// Validated text: 1 to [`MAX_FINGERPRINT_LEN`] bytes of visible ASCII (`!`..=`~`). Equality is
/// constant-time in the content (the length is not secret). Core never parses the text further,
/// so fingerprint versions (`v1:`, `h1:`, later ones) are opaque here: two fingerprints match only
/// when they are byte-identical.
#[derive(Clone, PartialOrd, Ord)]
pub struct FingerprintText(String);

impl FingerprintText {
    /// Validates `text` as a stored fingerprint.
    pub fn new(text: impl Into<String>) -> Result<Self, RecordError> {
        let text = text.into();
        if text.is_empty() || text.len() > MAX_FINGERPRINT_LEN {
            return Err(RecordError::InvalidFingerprint { len: text.len() });
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(RecordError::InvalidFingerprint { len: text.len() });
        }
        Ok(Self(text))
    }

    /// The text, as stored.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Constant-time comparison of the content.
    #[must_use]
    pub fn matches(&self, other: &Self) -> bool {
        self.0.as_bytes().ct_eq(other.0.as_bytes()).into()
    }
}

impl PartialEq for FingerprintText {
    fn eq(&self, other: &Self) -> bool {
        self.matches(other)
    }
}

impl Eq for FingerprintText {}

impl std::hash::Hash for FingerprintText {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl fmt::Debug for FingerprintText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FingerprintText({})", self.0)
    }
}

impl fmt::Display for FingerprintText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&crate::fingerprint::Fingerprint> for FingerprintText {
    /// The fingerprint's text form (`v1:<64 hex>` / `h1:<64 hex>`), always valid.
    fn from(fp: &crate::fingerprint::Fingerprint) -> Self {
        Self(fp.to_string())
    }
}

impl std::str::FromStr for FingerprintText {
    type Err = RecordError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// A fencing token: 16 random bytes from host entropy, fresh for every claim and takeover.
///
/// Never a counter: a per-row counter restarts after a purge, which would let a paused owner of an
/// old generation complete a new one (ABA).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub [u8; 16]);

impl FencingToken {
    /// The raw bytes (the `token` column).
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Reads a token from a column value; it must be exactly 16 bytes.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, RecordError> {
        let arr: [u8; 16] = bytes
            .try_into()
            .map_err(|_| RecordError::InvalidToken { len: bytes.len() })?;
        Ok(Self(arr))
    }

    /// Lowercase hex, 32 characters (for logs and Redis hashes that store text).
    #[must_use]
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({})", self.to_hex())
    }
}

/// The response kept for replays: status, allow-listed headers, body.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoredResponse {
    /// HTTP status code, 100..=599.
    pub status: u16,
    /// Allow-listed header fields in their original order; names are RFC 9110 tokens (stored
    /// lowercase by the flow), values are visible text.
    pub headers: Vec<(String, String)>,
    /// The body bytes (possibly a redacted copy supplied by the host).
    pub body: Vec<u8>,
}

/// Why a [`StoredResponse`] could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The status is outside 100..=599.
    #[error("status {0} is outside 100..=599")]
    InvalidStatus(u16),
    /// More than 65,535 header fields.
    #[error("too many header fields ({0}, at most 65535)")]
    TooManyHeaders(usize),
    /// A header name is empty, too long or not an RFC 9110 token.
    #[error("header name {0:?} is not an RFC 9110 token of at most 65535 bytes")]
    InvalidHeaderName(String),
    /// A header value contains a control character or is longer than 4 GiB.
    #[error("the value of header {0:?} contains a control character or is too long")]
    InvalidHeaderValue(String),
    /// The body is longer than 4 GiB − 1.
    #[error("body of {0} bytes exceeds the encodable maximum")]
    BodyTooLarge(usize),
}

/// Why bytes from the `response` column could not be decoded (corrupt or foreign data).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ended inside the named field.
    #[error("truncated response record: input ended inside {field}")]
    Truncated {
        /// The field being read.
        field: &'static str,
    },
    /// The input does not start with the `idr` magic.
    #[error("not an idempo response record (bad magic)")]
    BadMagic,
    /// The version byte is not one this build understands.
    #[error("unsupported response encoding version {0}")]
    UnsupportedVersion(u8),
    /// The stored status is outside 100..=599.
    #[error("stored status {0} is outside 100..=599")]
    InvalidStatus(u16),
    /// A stored header name is not an RFC 9110 token.
    #[error("stored header name at index {index} is not an RFC 9110 token")]
    InvalidHeaderName {
        /// Position of the header in the stored list.
        index: usize,
    },
    /// A stored header value is not UTF-8 or contains a control character.
    #[error("stored header value at index {index} is not valid text")]
    InvalidHeaderValue {
        /// Position of the header in the stored list.
        index: usize,
    },
    /// Bytes follow the body.
    #[error("{0} unexpected trailing bytes after the body")]
    TrailingBytes(usize),
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// True when `name` is a valid RFC 9110 field name (a non-empty token).
#[must_use]
pub fn is_valid_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(is_tchar)
}

/// True when `value` is acceptable as a stored field value: no control characters except HTAB.
#[must_use]
pub fn is_valid_header_value(value: &str) -> bool {
    value.chars().all(|c| c == '\t' || !c.is_control())
}

impl StoredResponse {
    /// Encodes the response in the current version (the `response` column).
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        if !(100..=599).contains(&self.status) {
            return Err(EncodeError::InvalidStatus(self.status));
        }
        let count = u16::try_from(self.headers.len())
            .map_err(|_| EncodeError::TooManyHeaders(self.headers.len()))?;
        let body_len = u32::try_from(self.body.len())
            .map_err(|_| EncodeError::BodyTooLarge(self.body.len()))?;
        let mut size = 3 + 1 + 2 + 2 + 4 + self.body.len();
        for (name, value) in &self.headers {
            size += 2 + name.len() + 4 + value.len();
        }
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(&RESPONSE_MAGIC);
        out.push(RESPONSE_VERSION);
        out.extend_from_slice(&self.status.to_be_bytes());
        out.extend_from_slice(&count.to_be_bytes());
        for (name, value) in &self.headers {
            let name_len = u16::try_from(name.len())
                .ok()
                .filter(|_| is_valid_header_name(name))
                .ok_or_else(|| EncodeError::InvalidHeaderName(name.clone()))?;
            let value_len = u32::try_from(value.len())
                .ok()
                .filter(|_| is_valid_header_value(value))
                .ok_or_else(|| EncodeError::InvalidHeaderValue(name.clone()))?;
            out.extend_from_slice(&name_len.to_be_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&value_len.to_be_bytes());
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(&body_len.to_be_bytes());
        out.extend_from_slice(&self.body);
        Ok(out)
    }

    /// Decodes a `response` column value; corrupt input gives a typed error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { rest: bytes };
        let magic = r.take(3, "magic")?;
        if magic != RESPONSE_MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = r.take(1, "version")?[0];
        if version != RESPONSE_VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let status = r.u16("status")?;
        if !(100..=599).contains(&status) {
            return Err(DecodeError::InvalidStatus(status));
        }
        let count = usize::from(r.u16("header count")?);
        // Each header needs at least 6 bytes, so a lying count cannot make us over-allocate.
        let mut headers = Vec::with_capacity(count.min(r.rest.len() / 6));
        for index in 0..count {
            let name_len = usize::from(r.u16("header name length")?);
            let name = r.take(name_len, "header name")?;
            let name = std::str::from_utf8(name)
                .ok()
                .filter(|n| is_valid_header_name(n))
                .ok_or(DecodeError::InvalidHeaderName { index })?;
            let value_len = r.u32("header value length")? as usize;
            let value = r.take(value_len, "header value")?;
            let value = std::str::from_utf8(value)
                .ok()
                .filter(|v| is_valid_header_value(v))
                .ok_or(DecodeError::InvalidHeaderValue { index })?;
            headers.push((name.to_owned(), value.to_owned()));
        }
        let body_len = r.u32("body length")? as usize;
        let body = r.take(body_len, "body")?.to_vec();
        if !r.rest.is_empty() {
            return Err(DecodeError::TrailingBytes(r.rest.len()));
        }
        Ok(Self {
            status,
            headers,
            body,
        })
    }
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < n {
            return Err(DecodeError::Truncated { field });
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        let b = self.take(2, field)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, field)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// The state of a record.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecordState {
    /// A worker holds the key and runs the handler; its lease ends at `lease_until_ms`.
    InProgress {
        /// End of the lease, unix ms on the store's clock.
        lease_until_ms: u64,
    },
    /// The handler finished and its response is kept for replays.
    Completed {
        /// The stored response.
        response: StoredResponse,
    },
    /// Terminal: an execution may have caused a side effect and its outcome was not recorded.
    OutcomeUnknown,
}

impl RecordState {
    /// The `state` column code: 1 in progress, 2 completed, 3 outcome unknown.
    #[must_use]
    pub fn code(&self) -> i64 {
        match self {
            Self::InProgress { .. } => STATE_IN_PROGRESS,
            Self::Completed { .. } => STATE_COMPLETED,
            Self::OutcomeUnknown => STATE_OUTCOME_UNKNOWN,
        }
    }
}

/// One record of the storage contract.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Record {
    /// Fingerprint of the request that claimed this generation.
    pub fingerprint: FingerprintText,
    /// 1 for the first claim of the scope key; +1 each time an expired record is replaced.
    pub generation: u32,
    /// The fencing token of the current owner (claim or last takeover).
    pub token: FencingToken,
    /// Retention deadline, unix ms on the store's clock; at or after it the record counts as absent.
    pub expires_at_ms: u64,
    /// The state.
    pub state: RecordState,
}

impl Record {
    /// A stand-in holding no allocation, in a memory store's slot while a primitive runs on the
    /// record it took out (`machine::memory`); never stored past that call, compared or shown.
    pub(crate) fn vacant() -> Record {
        Record {
            fingerprint: FingerprintText(String::new()),
            generation: 0,
            token: FencingToken([0; 16]),
            expires_at_ms: 0,
            state: RecordState::OutcomeUnknown,
        }
    }

    /// True when the record counts as absent at `now_ms` (`expires_at <= now`).
    #[must_use]
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms <= now_ms
    }

    /// The `lease_until` column: `Some` exactly for in-progress records.
    #[must_use]
    pub fn lease_until_ms(&self) -> Option<u64> {
        match self.state {
            RecordState::InProgress { lease_until_ms } => Some(lease_until_ms),
            _ => None,
        }
    }

    /// Builds a record from column values, checking every invariant of the storage contract.
    pub fn from_row(row: RecordRow) -> Result<Self, RecordError> {
        let fingerprint = FingerprintText::new(row.fingerprint)?;
        let token = FencingToken::from_slice(&row.token)?;
        let generation = u32::try_from(row.generation)
            .ok()
            .filter(|g| (1..=MAX_GENERATION).contains(g))
            .ok_or(RecordError::InvalidGeneration(row.generation))?;
        let expires_at_ms = u64::try_from(row.expires_at_ms)
            .map_err(|_| RecordError::NegativeTime("expires_at"))?;
        let lease = match row.lease_until_ms {
            None => None,
            Some(v) => {
                Some(u64::try_from(v).map_err(|_| RecordError::NegativeTime("lease_until"))?)
            }
        };
        let state = match (row.state, lease, row.response) {
            (STATE_IN_PROGRESS, Some(lease_until_ms), None) => {
                if lease_until_ms > expires_at_ms {
                    return Err(RecordError::LeaseAfterExpiry {
                        lease_until_ms,
                        expires_at_ms,
                    });
                }
                RecordState::InProgress { lease_until_ms }
            }
            (STATE_COMPLETED, None, Some(bytes)) => RecordState::Completed {
                response: StoredResponse::decode(&bytes)?,
            },
            (STATE_OUTCOME_UNKNOWN, None, None) => RecordState::OutcomeUnknown,
            (STATE_IN_PROGRESS | STATE_COMPLETED | STATE_OUTCOME_UNKNOWN, lease, response) => {
                return Err(RecordError::ColumnsDisagree {
                    state: row.state,
                    lease_present: lease.is_some(),
                    response_present: response.is_some(),
                });
            }
            (other, _, _) => return Err(RecordError::UnknownState(other)),
        };
        Ok(Self {
            fingerprint,
            generation,
            token,
            expires_at_ms,
            state,
        })
    }

    /// The column values of this record (the `response` column encoded in the current version).
    pub fn to_row(&self) -> Result<RecordRow, EncodeError> {
        let response = match &self.state {
            RecordState::Completed { response } => Some(response.encode()?),
            _ => None,
        };
        Ok(RecordRow {
            fingerprint: self.fingerprint.as_str().to_owned(),
            state: self.state.code(),
            token: self.token.0.to_vec(),
            generation: i64::from(self.generation),
            lease_until_ms: self.lease_until_ms().map(saturating_i64),
            expires_at_ms: saturating_i64(self.expires_at_ms),
            response,
        })
    }
}

fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The column values of one record, as a store reads or writes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordRow {
    /// `fingerprint` (TEXT).
    pub fingerprint: String,
    /// `state` (SMALLINT): 1, 2 or 3.
    pub state: i64,
    /// `token` (16 bytes).
    pub token: Vec<u8>,
    /// `generation` (INTEGER, ≥ 1).
    pub generation: i64,
    /// `lease_until` (BIGINT unix ms), NULL unless in progress.
    pub lease_until_ms: Option<i64>,
    /// `expires_at` (BIGINT unix ms).
    pub expires_at_ms: i64,
    /// `response` (encoded [`StoredResponse`]), NULL unless completed.
    pub response: Option<Vec<u8>>,
}

impl RecordRow {
    /// The row a Redis record hash holds (`spec/STORAGE.md` §5.1), from an `HGETALL` reply as
    /// field/value pairs: `fingerprint`, `state`, `token`, `generation`, `expires_at` required,
    /// `lease_until` and `response` optional; numbers are decimal strings, `token` and `response`
    /// raw bytes; unknown fields are ignored. `None` for an empty reply (no record). Every Redis
    /// store (Python, Node, the gateway) reads a hash this way; [`Record::from_row`] then checks
    /// the invariants.
    pub fn from_redis_hash<'a>(
        pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> Result<Option<Self>, RecordError> {
        let mut fields: [Option<&[u8]>; 7] = [None; 7];
        let mut any = false;
        for (name, value) in pairs {
            any = true;
            if let Some(i) = REDIS_FIELDS.iter().position(|f| f.as_bytes() == name) {
                fields[i] = Some(value);
            }
        }
        if !any {
            return Ok(None);
        }
        let [
            fingerprint,
            state,
            token,
            generation,
            lease_until,
            expires_at,
            response,
        ] = fields;
        let int = |v: &[u8], name: &'static str| {
            std::str::from_utf8(v)
                .ok()
                .and_then(|t| t.parse::<i64>().ok())
                .ok_or(RecordError::NotAnInteger(name))
        };
        fn need<'v>(v: Option<&'v [u8]>, name: &'static str) -> Result<&'v [u8], RecordError> {
            v.ok_or(RecordError::MissingField(name))
        }
        let fingerprint = need(fingerprint, "fingerprint")?;
        Ok(Some(Self {
            fingerprint: String::from_utf8(fingerprint.to_vec()).map_err(|_| {
                RecordError::InvalidFingerprint {
                    len: fingerprint.len(),
                }
            })?,
            state: int(need(state, "state")?, "state")?,
            token: need(token, "token")?.to_vec(),
            generation: int(need(generation, "generation")?, "generation")?,
            lease_until_ms: lease_until.map(|v| int(v, "lease_until")).transpose()?,
            expires_at_ms: int(need(expires_at, "expires_at")?, "expires_at")?,
            response: response.map(<[u8]>::to_vec),
        }))
    }
}

/// The fields of a Redis record hash, in [`RecordRow`]'s order (`spec/STORAGE.md` §5.1).
pub const REDIS_FIELDS: [&str; 7] = [
    "fingerprint",
    "state",
    "token",
    "generation",
    "lease_until",
    "expires_at",
    "response",
];

/// Why a row does not form a valid [`Record`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The fingerprint is empty, too long or not visible ASCII.
    #[error("invalid fingerprint text ({len} bytes; expected 1..=200 visible ASCII bytes)")]
    InvalidFingerprint {
        /// Its length in bytes.
        len: usize,
    },
    /// The token is not exactly 16 bytes.
    #[error("fencing token must be 16 bytes, got {len}")]
    InvalidToken {
        /// Its length in bytes.
        len: usize,
    },
    /// The generation is outside 1..=2^31-1.
    #[error("generation {0} is outside 1..=2147483647")]
    InvalidGeneration(i64),
    /// A time column is negative.
    #[error("column {0} holds a negative time")]
    NegativeTime(&'static str),
    /// The state code is not 1, 2 or 3.
    #[error("unknown state code {0}")]
    UnknownState(i64),
    /// `lease_until`/`response` presence does not fit the state.
    #[error(
        "state {state} does not fit lease_until present={lease_present}, response present={response_present}"
    )]
    ColumnsDisagree {
        /// The state code.
        state: i64,
        /// Whether `lease_until` was non-NULL.
        lease_present: bool,
        /// Whether `response` was non-NULL.
        response_present: bool,
    },
    /// An in-progress record whose lease outlives its expiry (`expires_at >= lease_until` must hold).
    #[error("lease_until {lease_until_ms} is after expires_at {expires_at_ms}")]
    LeaseAfterExpiry {
        /// The lease deadline.
        lease_until_ms: u64,
        /// The expiry.
        expires_at_ms: u64,
    },
    /// A Redis record hash lacks a required field.
    #[error("the record hash has no {0} field")]
    MissingField(&'static str),
    /// A numeric field of a Redis record hash is not a decimal integer.
    #[error("the record hash's {0} field is not a decimal integer")]
    NotAnInteger(&'static str),
    /// The `response` column is corrupt.
    #[error("corrupt response column: {0}")]
    Response(#[from] DecodeError),
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("location".into(), "/payments/42".into()),
            ],
            body: br#"{"id":42}"#.to_vec(),
        }
    }

    fn fp(s: &str) -> FingerprintText {
        FingerprintText::new(s).expect("valid fingerprint")
    }

    #[test]
    fn a_redis_hash_decodes_to_its_row() {
        let token = [7u8; 16];
        let pairs: Vec<(&[u8], &[u8])> = vec![
            (b"fingerprint", b"v1:abc"),
            (b"state", b"1"),
            (b"token", &token),
            (b"generation", b"3"),
            (b"lease_until", b"1700000005000"),
            (b"expires_at", b"1700000060000"),
            (b"extra", b"ignored"),
        ];
        let row = RecordRow::from_redis_hash(pairs.iter().copied())
            .expect("valid")
            .expect("present");
        assert_eq!(
            row,
            RecordRow {
                fingerprint: "v1:abc".into(),
                state: 1,
                token: token.to_vec(),
                generation: 3,
                lease_until_ms: Some(1_700_000_005_000),
                expires_at_ms: 1_700_000_060_000,
                response: None,
            }
        );
        assert!(Record::from_row(row).is_ok());
        assert_eq!(RecordRow::from_redis_hash(std::iter::empty()), Ok(None));
        let missing = &pairs[1..];
        assert_eq!(
            RecordRow::from_redis_hash(missing.iter().copied()),
            Err(RecordError::MissingField("fingerprint"))
        );
        let mut bad = pairs.clone();
        bad[3].1 = b"x";
        assert_eq!(
            RecordRow::from_redis_hash(bad.iter().copied()),
            Err(RecordError::NotAnInteger("generation"))
        );
    }

    #[test]
    fn response_round_trips() {
        let r = sample();
        let bytes = r.encode().expect("encodes");
        assert_eq!(&bytes[..4], b"idr\x01");
        assert_eq!(StoredResponse::decode(&bytes), Ok(r));
        let empty = StoredResponse {
            status: 204,
            headers: vec![],
            body: vec![],
        };
        let bytes = empty.encode().expect("encodes");
        assert_eq!(bytes, b"idr\x01\x00\xcc\x00\x00\x00\x00\x00\x00");
        assert_eq!(StoredResponse::decode(&bytes), Ok(empty));
    }

    #[test]
    fn encoding_layout_is_exact() {
        let r = StoredResponse {
            status: 200,
            headers: vec![("etag".into(), "\"x\"".into())],
            body: b"ok".to_vec(),
        };
        let expected: Vec<u8> = [
            &b"idr\x01"[..],
            &[0x00, 0xc8],
            &[0x00, 0x01],
            &[0x00, 0x04],
            b"etag",
            &[0, 0, 0, 3],
            b"\"x\"",
            &[0, 0, 0, 2],
            b"ok",
        ]
        .concat();
        assert_eq!(r.encode().expect("encodes"), expected);
    }

    #[test]
    fn every_truncation_is_a_typed_error() {
        let bytes = sample().encode().expect("encodes");
        for cut in 0..bytes.len() {
            let err = StoredResponse::decode(&bytes[..cut]).expect_err("truncated input must fail");
            assert!(
                matches!(err, DecodeError::Truncated { .. }),
                "cut {cut}: {err:?}"
            );
        }
    }

    #[test]
    fn corrupt_inputs_are_rejected() {
        let good = sample().encode().expect("encodes");
        let mut bad_magic = good.clone();
        bad_magic[0] = b'X';
        assert_eq!(
            StoredResponse::decode(&bad_magic),
            Err(DecodeError::BadMagic)
        );
        let mut bad_version = good.clone();
        bad_version[3] = 9;
        assert_eq!(
            StoredResponse::decode(&bad_version),
            Err(DecodeError::UnsupportedVersion(9))
        );
        let mut bad_status = good.clone();
        bad_status[4..6].copy_from_slice(&700u16.to_be_bytes());
        assert_eq!(
            StoredResponse::decode(&bad_status),
            Err(DecodeError::InvalidStatus(700))
        );
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(
            StoredResponse::decode(&trailing),
            Err(DecodeError::TrailingBytes(1))
        );
        // header name "content-type" -> "content type" (space is not a tchar)
        let mut bad_name = good.clone();
        bad_name[10 + 7] = b' ';
        assert_eq!(
            StoredResponse::decode(&bad_name),
            Err(DecodeError::InvalidHeaderName { index: 0 })
        );
        // a header count far larger than the input
        let mut lying = good.clone();
        lying[6..8].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(matches!(
            StoredResponse::decode(&lying),
            Err(DecodeError::Truncated { .. } | DecodeError::InvalidHeaderName { .. })
        ));
        // a body length past the end
        let mut long_body = good;
        let n = long_body.len();
        long_body[n - 13..n - 9].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            StoredResponse::decode(&long_body),
            Err(DecodeError::Truncated { field: "body" })
        );
    }

    #[test]
    fn control_characters_in_values_are_rejected_both_ways() {
        let r = StoredResponse {
            status: 200,
            headers: vec![("x-a".into(), "a\r\nset-cookie: x".into())],
            body: vec![],
        };
        assert_eq!(
            r.encode(),
            Err(EncodeError::InvalidHeaderValue("x-a".into()))
        );
        let ok = StoredResponse {
            status: 200,
            headers: vec![("x-a".into(), "a\tb".into())],
            body: vec![],
        };
        let mut bytes = ok.encode().expect("tab is allowed");
        let pos = bytes.iter().position(|&b| b == b'\t').expect("tab present");
        bytes[pos] = b'\n';
        assert_eq!(
            StoredResponse::decode(&bytes),
            Err(DecodeError::InvalidHeaderValue { index: 0 })
        );
        bytes[pos] = 0xff;
        assert_eq!(
            StoredResponse::decode(&bytes),
            Err(DecodeError::InvalidHeaderValue { index: 0 })
        );
    }

    #[test]
    fn encode_rejects_bad_status_and_names() {
        let mut r = sample();
        r.status = 99;
        assert_eq!(r.encode(), Err(EncodeError::InvalidStatus(99)));
        let mut r = sample();
        r.headers.push((String::new(), "x".into()));
        assert_eq!(
            r.encode(),
            Err(EncodeError::InvalidHeaderName(String::new()))
        );
    }

    #[test]
    fn core_fingerprints_convert() {
        use crate::fingerprint::{Fingerprint, FingerprintKind};
        let f = Fingerprint::from_parts(FingerprintKind::Sha256V1, [0xab; 32]);
        let text = FingerprintText::from(&f);
        assert_eq!(text.as_str(), format!("v1:{}", "ab".repeat(32)));
        assert_eq!(FingerprintText::new(text.as_str()), Ok(text));
    }

    #[test]
    fn fingerprint_text_validation_and_equality() {
        assert!(FingerprintText::new("").is_err());
        assert!(FingerprintText::new("v1:ab cd").is_err());
        assert!(FingerprintText::new("x".repeat(201)).is_err());
        assert!(FingerprintText::new("x".repeat(200)).is_ok());
        assert_eq!(fp("v1:abc"), fp("v1:abc"));
        assert_ne!(fp("v1:abc"), fp("v1:abd"));
        assert_ne!(fp("v1:abc"), fp("v1:abcd"));
    }

    fn row() -> RecordRow {
        RecordRow {
            fingerprint: "v1:aa".into(),
            state: 1,
            token: vec![7; 16],
            generation: 1,
            lease_until_ms: Some(1_000),
            expires_at_ms: 5_000,
            response: None,
        }
    }

    #[test]
    fn rows_round_trip_for_every_state() {
        let in_progress = Record::from_row(row()).expect("valid row");
        assert_eq!(
            in_progress.state,
            RecordState::InProgress {
                lease_until_ms: 1_000
            }
        );
        assert_eq!(in_progress.to_row().expect("encodes"), row());

        let completed = Record {
            state: RecordState::Completed { response: sample() },
            ..in_progress.clone()
        };
        let r = completed.to_row().expect("encodes");
        assert_eq!((r.state, r.lease_until_ms), (2, None));
        assert_eq!(Record::from_row(r), Ok(completed));

        let unknown = Record {
            state: RecordState::OutcomeUnknown,
            generation: 7,
            ..in_progress
        };
        let r = unknown.to_row().expect("encodes");
        assert_eq!((r.state, r.response.is_none()), (3, true));
        assert_eq!(Record::from_row(r), Ok(unknown));
    }

    #[test]
    fn corrupt_rows_are_typed_errors() {
        type Check = fn(&RecordError) -> bool;
        let cases: Vec<(RecordRow, Check)> = vec![
            (RecordRow { state: 4, ..row() }, |e| {
                matches!(e, RecordError::UnknownState(4))
            }),
            (
                RecordRow {
                    token: vec![1; 15],
                    ..row()
                },
                |e| matches!(e, RecordError::InvalidToken { len: 15 }),
            ),
            (
                RecordRow {
                    generation: 0,
                    ..row()
                },
                |e| matches!(e, RecordError::InvalidGeneration(0)),
            ),
            (
                RecordRow {
                    generation: 1 << 31,
                    ..row()
                },
                |e| matches!(e, RecordError::InvalidGeneration(_)),
            ),
            (
                RecordRow {
                    lease_until_ms: None,
                    ..row()
                },
                |e| matches!(e, RecordError::ColumnsDisagree { state: 1, .. }),
            ),
            (
                RecordRow {
                    lease_until_ms: Some(6_000),
                    ..row()
                },
                |e| matches!(e, RecordError::LeaseAfterExpiry { .. }),
            ),
            (
                RecordRow {
                    expires_at_ms: -1,
                    ..row()
                },
                |e| matches!(e, RecordError::NegativeTime("expires_at")),
            ),
            (
                RecordRow {
                    state: 2,
                    lease_until_ms: None,
                    response: None,
                    ..row()
                },
                |e| matches!(e, RecordError::ColumnsDisagree { state: 2, .. }),
            ),
            (
                RecordRow {
                    state: 2,
                    lease_until_ms: None,
                    response: Some(b"garbage".to_vec()),
                    ..row()
                },
                |e| matches!(e, RecordError::Response(DecodeError::BadMagic)),
            ),
            (
                RecordRow {
                    state: 3,
                    lease_until_ms: Some(1),
                    ..row()
                },
                |e| matches!(e, RecordError::ColumnsDisagree { state: 3, .. }),
            ),
            (
                RecordRow {
                    fingerprint: String::new(),
                    ..row()
                },
                |e| matches!(e, RecordError::InvalidFingerprint { .. }),
            ),
        ];
        for (i, (r, check)) in cases.into_iter().enumerate() {
            let err = Record::from_row(r).expect_err("corrupt row must fail");
            assert!(check(&err), "case {i}: {err:?}");
        }
    }
}
