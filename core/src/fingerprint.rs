//! The versioned request fingerprint: SHA-256 (or HMAC-SHA256 with a server key) over a
//! length-prefixed framing of the request parts that decide "is this the same request?".
//!
//! Two requests carrying the same idempotency key must produce the same fingerprint exactly when
//! they mean the same thing. So the framing takes the method (upper-cased), the route *template*,
//! the configured headers (names lower-cased, values trimmed, sorted by name), the content-type
//! class (JSON or other) and the body: RFC 8785 canonical JSON for JSON bodies, streamed into the
//! hasher without materializing it; the raw bytes for other media types. Volatile JSON fields are
//! left out by RFC 6901 pointer ([`FingerprintConfig::exclude`]).
//!
//! The text form is `v1:<64 lowercase hex>` (plain SHA-256) or `h1:<64 lowercase hex>`
//! (HMAC-SHA256 keyed with [`FingerprintConfig::hmac_key`]). The prefix names the framing version
//! and the algorithm, so the framing can evolve without turning stored fingerprints into false
//! mismatches. `spec/CANONICAL.md` gives the framing byte by byte.
//!
//! ```
//! use idempo_core::fingerprint::{fingerprint, FingerprintConfig, RequestParts};
//! let cfg = FingerprintConfig::default();
//! let a = RequestParts::json("post", "/payments", br#"{"amount":100,"currency":"EUR"}"#);
//! let b = RequestParts::json("POST", "/payments", br#"{ "currency":"EUR", "amount":1e2 }"#);
//! assert_eq!(fingerprint(&a, &cfg).unwrap(), fingerprint(&b, &cfg).unwrap());
//! assert!(fingerprint(&a, &cfg).unwrap().to_string().starts_with("v1:"));
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, TryLockError};

use hmac::{Hmac, KeyInit, Mac};
use sha2::digest::Update;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::canonical::{
    CanonError, CanonOptions, DigestSink, Exclusions, Limits, NumberMode, PointerError, Scratch,
    canonicalize_scratch,
};

/// The domain-separation and version tag that starts every v1 framing.
pub const FRAMING_TAG_V1: &[u8] = b"idempo/fingerprint/v1";

/// Content-type class byte: JSON (`application/json` or any `*/*+json`).
const CLASS_JSON: u8 = 0x01;
/// Content-type class byte: anything else, including no content type.
const CLASS_OTHER: u8 = 0x02;
/// Body kind byte: empty body.
const BODY_EMPTY: u8 = 0x00;
/// Body kind byte: RFC 8785 canonical JSON.
const BODY_JSON: u8 = 0x01;
/// Body kind byte: raw bytes.
const BODY_RAW: u8 = 0x02;
/// JSON bodies up to this size are canonicalized into the kept framing buffer and hashed in
/// one update; larger ones stream into the hasher.
const INLINE_BODY: usize = 64 * 1024;

/// The parts of an HTTP request that the fingerprint covers. Borrowed: nothing is copied.
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    /// HTTP method; ASCII letters are upper-cased before hashing.
    pub method: &'a str,
    /// The route template chosen by the host (`/payments/{id}`), not the concrete path.
    pub route: &'a str,
    /// Request headers as (name, value) pairs, in arrival order. Only the names listed in
    /// [`FingerprintConfig::header_names`] are used (matched case-insensitively).
    pub headers: &'a [(&'a str, &'a str)],
    /// The `Content-Type` header value, if any.
    pub content_type: Option<&'a str>,
    /// The raw body bytes.
    pub body: &'a [u8],
}

impl<'a> RequestParts<'a> {
    /// A request with an `application/json` body and no headers.
    #[must_use]
    pub fn json(method: &'a str, route: &'a str, body: &'a [u8]) -> Self {
        Self {
            method,
            route,
            headers: &[],
            content_type: Some("application/json"),
            body,
        }
    }
}

/// How fingerprints are computed. All services that share a store must use the same config.
#[derive(Clone, PartialEq, Eq)]
pub struct FingerprintConfig {
    /// Header names that take part (case-insensitive; duplicates are merged). Default: none.
    pub header_names: Vec<String>,
    /// RFC 6901 pointers of JSON values left out (e.g. `/client_timestamp`); see
    /// [`Exclusions`] for the exact semantics. Default: none.
    pub exclude: Vec<String>,
    /// Number policy for JSON bodies. Default: [`NumberMode::RejectPrecisionLoss`], so two
    /// different numbers can never share a fingerprint through rounding.
    pub numbers: NumberMode,
    /// Limits for JSON bodies. Default: [`Limits::default`].
    pub limits: Limits,
    /// When set, fingerprints are HMAC-SHA256 under this key (`h1:`), not bare SHA-256 (`v1:`),
    /// so a leaked table cannot confirm guessed bodies. Must not be empty.
    pub hmac_key: Option<Vec<u8>>,
}

impl Default for FingerprintConfig {
    fn default() -> Self {
        Self {
            header_names: Vec::new(),
            exclude: Vec::new(),
            numbers: NumberMode::RejectPrecisionLoss,
            limits: Limits::default(),
            hmac_key: None,
        }
    }
}

impl fmt::Debug for FingerprintConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FingerprintConfig")
            .field("header_names", &self.header_names)
            .field("exclude", &self.exclude)
            .field("numbers", &self.numbers)
            .field("limits", &self.limits)
            .field("hmac_key", &self.hmac_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Why a fingerprint could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// The body is declared JSON but is not acceptable canonical-JSON input.
    #[error("request body: {0}")]
    Body(#[from] CanonError),
    /// An exclusion pointer in the config is malformed.
    #[error("exclusion pointer: {0}")]
    Exclusion(#[from] PointerError),
    /// [`FingerprintConfig::hmac_key`] is `Some` but empty.
    #[error("the HMAC key is empty")]
    EmptyHmacKey,
    /// A configured header name is empty or not an HTTP token.
    #[error("configured header name {0:?} is not a valid HTTP field name")]
    InvalidHeaderName(String),
}

impl FingerprintError {
    /// Stable snake_case code; for [`FingerprintError::Body`] the canonicalizer's code
    /// (e.g. `"precision_loss"`).
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Body(e) => e.code(),
            Self::Exclusion(e) => e.code(),
            Self::EmptyHmacKey => "empty_hmac_key",
            Self::InvalidHeaderName(_) => "invalid_header_name",
        }
    }
}

/// Which algorithm (and framing version) produced a [`Fingerprint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FingerprintKind {
    /// `v1:`: SHA-256 over the v1 framing.
    Sha256V1,
    /// `h1:`: HMAC-SHA256 over the v1 framing, keyed by the server.
    HmacSha256V1,
}

impl FingerprintKind {
    /// The text prefix without the colon: `"v1"` or `"h1"`.
    #[must_use]
    pub fn prefix(self) -> &'static str {
        match self {
            Self::Sha256V1 => "v1",
            Self::HmacSha256V1 => "h1",
        }
    }
}

/// Length of a fingerprint's text form: a two-letter version, a colon and 64 hex digits.
pub const FINGERPRINT_TEXT_LEN: usize = 67;

/// A fingerprint's text form (`v1:<64 hex>`) held on the stack; see [`Fingerprint::text`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FingerprintText([u8; FINGERPRINT_TEXT_LEN]);

impl FingerprintText {
    /// The text's bytes (ASCII; hosts that build strings from Latin-1 or bytes skip the UTF-8
    /// check of [`as_str`](Self::as_str)).
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; FINGERPRINT_TEXT_LEN] {
        &self.0
    }

    /// The text (always ASCII).
    #[must_use]
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever written (prefix, ':' and hex digits), so this cannot fail.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Debug for FingerprintText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Lowercase hex of four bytes, all at once: each byte is spread to a 16-bit lane, its nibbles
/// to the lane's two bytes (high nibble first), and every nibble turned to ASCII together.
#[inline(always)]
fn hex4(bytes: [u8; 4]) -> [u8; 8] {
    const NIBBLES: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    let mut x = u64::from(u32::from_le_bytes(bytes));
    x = (x | (x << 16)) & 0x0000_FFFF_0000_FFFF;
    x = (x | (x << 8)) & 0x00FF_00FF_00FF_00FF;
    let nibbles = ((x >> 4) | (x << 8)) & NIBBLES;
    // 10..=15 reach 16 when 6 is added: those bytes get 'a' - '0' - 10 more.
    let letters = ((nibbles + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
    (nibbles + 0x3030_3030_3030_3030 + letters * 39).to_le_bytes()
}

/// A request fingerprint. Displays as `v1:<64 hex>` or `h1:<64 hex>`; parses back with
/// [`FromStr`]. Equality is constant-time over the digest.
#[derive(Clone, Copy)]
pub struct Fingerprint {
    kind: FingerprintKind,
    digest: [u8; 32],
}

impl Fingerprint {
    /// Build from parts (e.g. a digest computed elsewhere).
    #[must_use]
    pub fn from_parts(kind: FingerprintKind, digest: [u8; 32]) -> Self {
        Self { kind, digest }
    }

    /// The algorithm and framing version.
    #[must_use]
    pub fn kind(&self) -> FingerprintKind {
        self.kind
    }

    /// The 32 digest bytes.
    #[must_use]
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }

    /// The text form (`v1:<64 hex>`) on the stack: what [`Display`](fmt::Display) writes, without
    /// a `String` allocation (bindings turn it into a host string directly).
    #[must_use]
    pub fn text(&self) -> FingerprintText {
        let mut text = [0u8; FINGERPRINT_TEXT_LEN];
        text[..2].copy_from_slice(self.kind.prefix().as_bytes());
        text[2] = b':';
        for (out, bytes) in text[3..]
            .chunks_exact_mut(8)
            .zip(self.digest.chunks_exact(4))
        {
            let mut four = [0u8; 4];
            four.copy_from_slice(bytes);
            out.copy_from_slice(&hex4(four));
        }
        FingerprintText(text)
    }

    /// Constant-time comparison (kinds compared first; they are not secret).
    #[must_use]
    pub fn ct_eq(&self, other: &Self) -> bool {
        self.kind == other.kind && bool::from(self.digest.ct_eq(&other.digest))
    }
}

impl PartialEq for Fingerprint {
    fn eq(&self, other: &Self) -> bool {
        self.ct_eq(other)
    }
}

impl Eq for Fingerprint {}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text().as_str())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// Why a fingerprint text did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseFingerprintError {
    /// The prefix is neither `v1:` nor `h1:`.
    #[error("unknown fingerprint version (expected \"v1:\" or \"h1:\")")]
    UnknownVersion,
    /// The digest is not exactly 64 lowercase hexadecimal characters.
    #[error("fingerprint digest must be 64 lowercase hex characters")]
    InvalidDigest,
}

impl ParseFingerprintError {
    /// Stable snake_case code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::UnknownVersion => "unknown_fingerprint_version",
            Self::InvalidDigest => "invalid_fingerprint_digest",
        }
    }
}

impl FromStr for Fingerprint {
    type Err = ParseFingerprintError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, hex) = if let Some(h) = s.strip_prefix("v1:") {
            (FingerprintKind::Sha256V1, h)
        } else if let Some(h) = s.strip_prefix("h1:") {
            (FingerprintKind::HmacSha256V1, h)
        } else {
            return Err(ParseFingerprintError::UnknownVersion);
        };
        let hex = hex.as_bytes();
        if hex.len() != 64 {
            return Err(ParseFingerprintError::InvalidDigest);
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(ParseFingerprintError::InvalidDigest),
        };
        let mut digest = [0u8; 32];
        for (i, pair) in hex.chunks_exact(2).enumerate() {
            digest[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
        }
        Ok(Self { kind, digest })
    }
}

/// True for `application/json` and any `type/subtype+json` media type (case-insensitive;
/// parameters such as `charset` are ignored).
#[must_use]
pub fn is_json_media_type(content_type: &str) -> bool {
    // The common exact spelling first: this runs on every fingerprint.
    if content_type == "application/json" {
        return true;
    }
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim_matches(|c| c == ' ' || c == '\t');
    let Some((ty, sub)) = essence.split_once('/') else {
        return false;
    };
    if ty.is_empty() || sub.is_empty() {
        return false;
    }
    let ends_with_json = sub.len() >= 5
        && sub.is_char_boundary(sub.len() - 5)
        && sub[sub.len() - 5..].eq_ignore_ascii_case("+json");
    (ty.eq_ignore_ascii_case("application") && sub.eq_ignore_ascii_case("json")) || ends_with_json
}

fn is_token_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

fn trim_ows(s: &str) -> &str {
    s.trim_matches(|c| c == ' ' || c == '\t')
}

enum Hasher {
    Plain,
    Keyed(Box<Hmac<Sha256>>),
}

/// A prepared fingerprint configuration: pointers compiled, header names normalized and the
/// HMAC key schedule computed once. Cheap to share; use it on hot paths.
///
/// It also keeps the canonicalizer's working memory between calls (no result depends on it):
/// a call that finds it in use by another thread works with fresh memory instead of waiting.
pub struct Fingerprinter {
    headers: Vec<String>,
    exclusions: Exclusions,
    opts: CanonOptions,
    hasher: Hasher,
    scratch: Mutex<FpScratch>,
}

impl fmt::Debug for Fingerprinter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fingerprinter")
            .field("headers", &self.headers)
            .field("opts", &self.opts)
            .field("keyed", &matches!(self.hasher, Hasher::Keyed(_)))
            .finish_non_exhaustive()
    }
}

impl Fingerprinter {
    /// Validate and prepare `config`.
    ///
    /// # Errors
    /// [`FingerprintError::Exclusion`], [`FingerprintError::EmptyHmacKey`] or
    /// [`FingerprintError::InvalidHeaderName`].
    pub fn new(config: &FingerprintConfig) -> Result<Self, FingerprintError> {
        let mut headers = Vec::with_capacity(config.header_names.len());
        for name in &config.header_names {
            if name.is_empty() || !name.bytes().all(is_token_char) {
                return Err(FingerprintError::InvalidHeaderName(name.clone()));
            }
            headers.push(name.to_ascii_lowercase());
        }
        headers.sort_unstable();
        headers.dedup();
        let exclusions = Exclusions::new(&config.exclude)?;
        let hasher = match &config.hmac_key {
            None => Hasher::Plain,
            Some(k) if k.is_empty() => return Err(FingerprintError::EmptyHmacKey),
            Some(k) => {
                let mac = <Hmac<Sha256> as KeyInit>::new_from_slice(k)
                    .map_err(|_| FingerprintError::EmptyHmacKey)?;
                Hasher::Keyed(Box::new(mac))
            }
        };
        Ok(Self {
            headers,
            exclusions,
            opts: CanonOptions {
                limits: config.limits,
                numbers: config.numbers,
            },
            hasher,
            scratch: Mutex::new(FpScratch::default()),
        })
    }

    /// The kind of fingerprint this configuration produces.
    #[must_use]
    pub fn kind(&self) -> FingerprintKind {
        match self.hasher {
            Hasher::Plain => FingerprintKind::Sha256V1,
            Hasher::Keyed(_) => FingerprintKind::HmacSha256V1,
        }
    }

    /// Fingerprint one request.
    ///
    /// # Errors
    /// [`FingerprintError::Body`] when the content type is JSON and the non-empty body is not
    /// acceptable (syntax, duplicates, limits, precision loss, ...).
    pub fn fingerprint(&self, parts: &RequestParts<'_>) -> Result<Fingerprint, FingerprintError> {
        let json = parts.content_type.is_some_and(is_json_media_type);
        self.digest(&Head::Parts(parts), json, parts.body)
    }

    /// Bind this configuration to one method and route template: the per-route hot path
    /// computes the framing fields before the body once (see [`RouteFingerprinter`]).
    #[must_use]
    pub fn for_route(self: &Arc<Self>, method: &str, route: &str) -> RouteFingerprinter {
        let mut head = Vec::new();
        self.head(
            &mut Collect(&mut head),
            &RequestParts::json(method, route, b""),
        );
        RouteFingerprinter {
            fingerprinter: Arc::clone(self),
            head,
        }
    }

    fn digest(
        &self,
        head: &Head<'_>,
        json: bool,
        body: &[u8],
    ) -> Result<Fingerprint, FingerprintError> {
        let digest: [u8; 32] = match &self.hasher {
            Hasher::Plain => self
                .frame(Sha256::new(), head, json, body)?
                .finalize()
                .into(),
            Hasher::Keyed(mac) => self
                .frame(mac.as_ref().clone(), head, json, body)?
                .finalize()
                .into_bytes()
                .into(),
        };
        Ok(Fingerprint {
            kind: self.kind(),
            digest,
        })
    }

    /// The framing fields before the content-type class, from the request or precomputed.
    fn write_head<U: Update>(&self, d: &mut U, head: &Head<'_>) {
        match head {
            Head::Parts(parts) => self.head(d, parts),
            Head::Bytes(bytes) => d.update(bytes),
        }
    }

    /// Write the v1 framing of a request (its head fields, then `body`) into `d`.
    ///
    /// Bodies up to [`INLINE_BODY`] bytes: the whole framing is laid out in the kept buffer
    /// (the canonical body written in place) and hashed with one update, which costs less
    /// than many small updates through a zeroed sink buffer. Larger JSON bodies stream into
    /// the hasher through a [`DigestSink`]; raw bodies are hashed where they are.
    fn frame<D: Update>(
        &self,
        mut d: D,
        head: &Head<'_>,
        json: bool,
        body: &[u8],
    ) -> Result<D, FingerprintError> {
        let class = if json { CLASS_JSON } else { CLASS_OTHER };
        if body.is_empty() || !json {
            // No JSON work: the fields go straight into the hasher.
            self.write_head(&mut d, head);
            d.update(&[class]);
            if body.is_empty() {
                d.update(&[BODY_EMPTY]);
                d.update(&0u64.to_be_bytes());
            } else {
                d.update(&[BODY_RAW]);
                d.update(body);
                d.update(&(body.len() as u64).to_be_bytes());
            }
            return Ok(d);
        }
        let mut guard = match self.scratch.try_lock() {
            Ok(g) => Some(g),
            // The scratch is emptied at every use: a panic elsewhere left nothing that
            // matters in it.
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        let mut fresh = None;
        let scratch = match guard.as_deref_mut() {
            Some(s) => s,
            None => fresh.insert(FpScratch::default()),
        };
        let out = &mut scratch.out;
        out.clear();
        self.write_head(&mut Collect(out), head);
        out.push(class);
        out.push(BODY_JSON);
        let (opts, excl) = (&self.opts, &self.exclusions);
        if body.len() <= INLINE_BODY {
            let at = out.len();
            canonicalize_scratch(body, opts, excl, out, &mut scratch.canon)?;
            let len = (out.len() - at) as u64;
            out.extend_from_slice(&len.to_be_bytes());
            d.update(out);
        } else {
            d.update(out);
            let mut sink = DigestSink::new(d);
            canonicalize_scratch(body, opts, excl, &mut sink, &mut scratch.canon)?;
            let (inner, len) = sink.finish();
            d = inner;
            d.update(&len.to_be_bytes());
        }
        if scratch.out.capacity() > 2 * INLINE_BODY {
            scratch.out = Vec::new();
        }
        drop(guard);
        Ok(d)
    }

    /// The framing fields before the content-type class: tag, method, route, headers.
    fn head<U: Update>(&self, d: &mut U, parts: &RequestParts<'_>) {
        fn field<U: Update>(d: &mut U, bytes: &[u8]) {
            d.update(&(bytes.len() as u32).to_be_bytes());
            d.update(bytes);
        }
        field(d, FRAMING_TAG_V1);
        // Upper-cased method, without allocating.
        d.update(&(parts.method.len() as u32).to_be_bytes());
        for chunk in parts.method.as_bytes().chunks(32) {
            let mut up = [0u8; 32];
            for (u, b) in up.iter_mut().zip(chunk) {
                *u = b.to_ascii_uppercase();
            }
            d.update(&up[..chunk.len()]);
        }
        field(d, parts.route.as_bytes());
        d.update(&(self.headers.len() as u32).to_be_bytes());
        for name in &self.headers {
            field(d, name.as_bytes());
            let matching = || {
                parts
                    .headers
                    .iter()
                    .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            };
            d.update(&(matching().count() as u32).to_be_bytes());
            for (_, value) in matching() {
                field(d, trim_ows(value).as_bytes());
            }
        }
    }
}

/// Where the framing fields before the body come from.
enum Head<'a> {
    /// Written from the request.
    Parts(&'a RequestParts<'a>),
    /// Precomputed by [`Fingerprinter::for_route`].
    Bytes(&'a [u8]),
}

/// A [`Fingerprinter`] bound to one method and route template, for JSON bodies sent without
/// any of the configured headers: the framing fields before the body are computed once.
///
/// `route.fingerprint_json(body)` equals
/// `fingerprinter.fingerprint(&RequestParts::json(method, route, body))`.
#[derive(Debug, Clone)]
pub struct RouteFingerprinter {
    fingerprinter: Arc<Fingerprinter>,
    head: Vec<u8>,
}

impl RouteFingerprinter {
    /// The fingerprint of a JSON body sent to this route.
    ///
    /// # Errors
    /// [`FingerprintError::Body`] when the non-empty body is not acceptable.
    pub fn fingerprint_json(&self, body: &[u8]) -> Result<Fingerprint, FingerprintError> {
        self.fingerprinter
            .digest(&Head::Bytes(&self.head), true, body)
    }

    /// The configuration this route uses.
    #[must_use]
    pub fn fingerprinter(&self) -> &Arc<Fingerprinter> {
        &self.fingerprinter
    }
}

/// Collects framing bytes in a vector (hashed later in one update).
struct Collect<'a>(&'a mut Vec<u8>);

impl Update for Collect<'_> {
    fn update(&mut self, data: &[u8]) {
        self.0.extend_from_slice(data);
    }
}

/// A fingerprinter's kept working memory: the canonicalizer's vectors and the framing buffer.
#[derive(Default)]
struct FpScratch {
    canon: Scratch,
    out: Vec<u8>,
}

/// Fingerprint `parts` under `config` (prepares a [`Fingerprinter`] each call; keep one around on
/// hot paths).
///
/// # Errors
/// Configuration errors and [`FingerprintError::Body`] for an unacceptable JSON body.
pub fn fingerprint(
    parts: &RequestParts<'_>,
    config: &FingerprintConfig,
) -> Result<Fingerprint, FingerprintError> {
    Fingerprinter::new(config)?.fingerprint(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(parts: &RequestParts<'_>, cfg: &FingerprintConfig) -> Fingerprint {
        fingerprint(parts, cfg).expect("fingerprint")
    }

    #[test]
    fn framing_matches_manual_bytes() {
        let cfg = FingerprintConfig {
            header_names: vec!["X-Tenant".into()],
            ..FingerprintConfig::default()
        };
        let parts = RequestParts {
            method: "post",
            route: "/p/{id}",
            headers: &[("x-tenant", " acme\t")],
            content_type: Some("application/json; charset=utf-8"),
            body: b"{\"b\":1,\"a\":2}",
        };
        let mut m = Vec::new();
        let field = |m: &mut Vec<u8>, b: &[u8]| {
            m.extend_from_slice(&(b.len() as u32).to_be_bytes());
            m.extend_from_slice(b);
        };
        field(&mut m, b"idempo/fingerprint/v1");
        field(&mut m, b"POST");
        field(&mut m, b"/p/{id}");
        m.extend_from_slice(&1u32.to_be_bytes());
        field(&mut m, b"x-tenant");
        m.extend_from_slice(&1u32.to_be_bytes());
        field(&mut m, b"acme");
        m.push(1);
        m.push(1);
        m.extend_from_slice(b"{\"a\":2,\"b\":1}");
        m.extend_from_slice(&13u64.to_be_bytes());
        let want: [u8; 32] = Sha256::digest(&m).into();
        assert_eq!(fp(&parts, &cfg).digest(), &want);
    }

    /// Raw and empty bodies, with short and long routes and header values, frame the same bytes
    /// as the manual layout.
    #[test]
    fn raw_framing_matches_manual_bytes_short_and_long() {
        let cfg = FingerprintConfig {
            header_names: vec!["x-a".into()],
            ..FingerprintConfig::default()
        };
        for (route, value, body) in [
            ("/r".to_owned(), "v".to_owned(), &b""[..]),
            ("/r".to_owned(), "v".to_owned(), &b"raw bytes"[..]),
            (
                format!("/{}", "r".repeat(300)),
                "v".repeat(500),
                &b"raw"[..],
            ),
            (format!("/{}", "r".repeat(200)), "v".repeat(30), &b""[..]),
        ] {
            let headers = [("X-A", value.as_str())];
            let parts = RequestParts {
                method: "put",
                route: &route,
                headers: &headers,
                content_type: Some("text/plain"),
                body,
            };
            let mut m = Vec::new();
            let field = |m: &mut Vec<u8>, b: &[u8]| {
                m.extend_from_slice(&(b.len() as u32).to_be_bytes());
                m.extend_from_slice(b);
            };
            field(&mut m, b"idempo/fingerprint/v1");
            field(&mut m, b"PUT");
            field(&mut m, route.as_bytes());
            m.extend_from_slice(&1u32.to_be_bytes());
            field(&mut m, b"x-a");
            m.extend_from_slice(&1u32.to_be_bytes());
            field(&mut m, value.as_bytes());
            m.push(CLASS_OTHER);
            m.push(if body.is_empty() {
                BODY_EMPTY
            } else {
                BODY_RAW
            });
            m.extend_from_slice(body);
            m.extend_from_slice(&(body.len() as u64).to_be_bytes());
            let want: [u8; 32] = Sha256::digest(&m).into();
            assert_eq!(
                fp(&parts, &cfg).digest(),
                &want,
                "route of {} bytes",
                route.len()
            );
        }
    }

    #[test]
    fn distinctions() {
        let cfg = FingerprintConfig {
            header_names: vec!["x-a".into()],
            ..FingerprintConfig::default()
        };
        let base = RequestParts {
            method: "POST",
            route: "/r",
            headers: &[],
            content_type: Some("text/plain"),
            body: b"",
        };
        let missing = fp(&base, &cfg);
        let empty = fp(
            &RequestParts {
                headers: &[("X-A", "  ")],
                ..base
            },
            &cfg,
        );
        assert_ne!(missing, empty, "missing header differs from empty header");
        let json_empty = fp(
            &RequestParts {
                content_type: Some("application/json"),
                ..base
            },
            &cfg,
        );
        assert_ne!(missing, json_empty, "class is framed");
        assert_ne!(
            fp(
                &RequestParts {
                    body: b"{}",
                    ..base
                },
                &cfg
            ),
            fp(
                &RequestParts {
                    body: b"{}",
                    content_type: Some("application/problem+json"),
                    ..base
                },
                &cfg
            )
        );
    }

    /// A route-bound fingerprinter gives what the full call gives, for every configuration kind
    /// (plain, header names, HMAC) and body kind (empty, JSON, invalid).
    #[test]
    fn route_fingerprinter_matches_the_full_call() {
        let configs = [
            FingerprintConfig::default(),
            FingerprintConfig {
                header_names: vec!["X-Tenant".into(), "accept".into()],
                ..FingerprintConfig::default()
            },
            FingerprintConfig {
                hmac_key: Some(b"k".to_vec()),
                exclude: vec!["/ts".into()],
                ..FingerprintConfig::default()
            },
        ];
        let long_route = format!("/{}", "r".repeat(300));
        for cfg in &configs {
            let fpr = Arc::new(Fingerprinter::new(cfg).expect("config"));
            for (method, route) in [("post", "/payments"), ("PATCH", long_route.as_str())] {
                let bound = fpr.for_route(method, route);
                for body in [&b""[..], b"{}", br#"{"b":1,"a":[1.5,"x"],"ts":3}"#, b"[1,"] {
                    let full = fpr.fingerprint(&RequestParts::json(method, route, body));
                    let fast = bound.fingerprint_json(body);
                    match (full, fast) {
                        (Ok(a), Ok(b)) => assert_eq!(a.text(), b.text()),
                        (Err(a), Err(b)) => assert_eq!(a.code(), b.code()),
                        (a, b) => panic!("{method} {route}: {a:?} vs {b:?}"),
                    }
                }
            }
        }
    }

    /// The word-at-a-time hex agrees with a per-byte formatter for every byte value in every
    /// position.
    #[test]
    fn text_hex_matches_per_byte_formatting() {
        for start in 0..=255u8 {
            let mut digest = [0u8; 32];
            for (i, b) in digest.iter_mut().enumerate() {
                *b = start.wrapping_add((i as u8).wrapping_mul(37));
            }
            let f = Fingerprint::from_parts(FingerprintKind::Sha256V1, digest);
            let want: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(f.text().as_str(), format!("v1:{want}"));
            assert_eq!(f.text().as_bytes(), f.text().as_str().as_bytes());
        }
    }

    #[test]
    fn text_round_trip_and_hmac() {
        let cfg = FingerprintConfig {
            hmac_key: Some(b"server secret".to_vec()),
            ..FingerprintConfig::default()
        };
        let parts = RequestParts::json("POST", "/x", b"[1]");
        let h = fp(&parts, &cfg);
        let v = fp(&parts, &FingerprintConfig::default());
        assert_eq!(h.kind(), FingerprintKind::HmacSha256V1);
        assert!(h.to_string().starts_with("h1:"));
        assert_ne!(h.digest(), v.digest());
        for f in [h, v] {
            let text = f.to_string();
            assert_eq!(text.len(), FINGERPRINT_TEXT_LEN);
            assert_eq!(f.text().as_str(), text);
            assert_eq!(format!("{:?}", f.text()), format!("{text:?}"));
            assert_eq!(text.parse::<Fingerprint>().expect("parse"), f);
        }
        assert_eq!(
            "x1:00".parse::<Fingerprint>().unwrap_err().code(),
            "unknown_fingerprint_version"
        );
        let upper = format!("v1:{}", v.to_string()[3..].to_ascii_uppercase());
        if upper != v.to_string() {
            assert_eq!(
                upper.parse::<Fingerprint>().unwrap_err().code(),
                "invalid_fingerprint_digest"
            );
        }
        assert!("v1:abc".parse::<Fingerprint>().is_err());
        let empty_key = FingerprintConfig {
            hmac_key: Some(Vec::new()),
            ..FingerprintConfig::default()
        };
        assert_eq!(
            Fingerprinter::new(&empty_key).unwrap_err().code(),
            "empty_hmac_key"
        );
    }

    #[test]
    fn precision_loss_is_reported_with_pointer() {
        let e = fingerprint(
            &RequestParts::json("POST", "/x", br#"{"amount":9007199254740993}"#),
            &FingerprintConfig::default(),
        )
        .unwrap_err();
        assert_eq!(e.code(), "precision_loss");
        let FingerprintError::Body(c) = e else {
            panic!("body error expected")
        };
        assert_eq!(c.pointer.as_deref(), Some("/amount"));
    }

    /// The working memory kept between calls changes no result: every body fingerprints the
    /// same through one long-lived fingerprinter as through a fresh one, errors included.
    #[test]
    fn reused_scratch_changes_nothing() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Fingerprinter>();
        let bodies: [&[u8]; 8] = [
            br#"[{"long_member_name":1,"another_long_name":2},{"long_member_name":3,"another_long_name":4}]"#,
            br#"[{"another_long_name":1,"long_member_name":2},{"x":[{"b":1,"a":2}]}]"#,
            br#"{"a":[{"long_member_name":1,"long_member_name":2}]}"#,
            br#"[{"long_member_name":1,"another_long_name":2},{"long_member_name":"A","another_long_name":0.1}]"#,
            br#"{"b":"\u00e9","a":[1e2,-0,"x"]}"#,
            b"[1,",
            br#"[[{"q":1,"p":2}],[{"q":3,"p":4}]]"#,
            br#"{"b":1,"a":2}"#,
        ];
        let cfg = FingerprintConfig::default();
        let kept = Fingerprinter::new(&cfg).expect("config");
        for round in 0..2 {
            for body in bodies {
                let parts = RequestParts::json("POST", "/r", body);
                let fresh = Fingerprinter::new(&cfg)
                    .expect("config")
                    .fingerprint(&parts);
                assert_eq!(kept.fingerprint(&parts), fresh, "round {round}: {body:?}");
            }
        }
        let big: Vec<u8> = format!("[{}0]", "{\"k\":[1,2,3]},".repeat(20_000)).into_bytes();
        let parts = RequestParts::json("POST", "/r", &big);
        let fresh = Fingerprinter::new(&cfg)
            .expect("config")
            .fingerprint(&parts);
        assert_eq!(kept.fingerprint(&parts), fresh);
        let small = RequestParts::json("POST", "/r", bodies[7]);
        assert_eq!(kept.fingerprint(&small), fingerprint(&small, &cfg));
    }

    #[test]
    fn media_types() {
        assert!(is_json_media_type("application/json"));
        assert!(is_json_media_type("Application/JSON ; charset=utf-8"));
        assert!(is_json_media_type("application/vnd.api+json"));
        assert!(!is_json_media_type("text/plain"));
        assert!(!is_json_media_type("application/jsonx"));
        assert!(!is_json_media_type("json"));
        assert!(is_json_media_type("application/problem+JSON;q=1"));
        assert!(is_json_media_type(" text/+json\t"));
        assert!(!is_json_media_type("application/é+jso"));
        assert!(!is_json_media_type("application/éjson"));
        assert!(!is_json_media_type("/json"));
    }
}
