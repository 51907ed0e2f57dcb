//! The versioned request fingerprint over the FFI (`idempo_core::fingerprint`).
use idempo_core::canonical::Limits;
use idempo_core::fingerprint as core;

use crate::canonical::NumberMode;
use crate::{to_u64, to_usize};

/// One request header (name, value) as sent.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct Header {
    /// Field name (matched case-insensitively against the configured names).
    pub name: String,
    /// Field value.
    pub value: String,
}

/// The parts of a request the fingerprint covers (core `RequestParts`).
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct FingerprintRequest {
    /// HTTP method (upper-cased by core).
    pub method: String,
    /// The route template (`/payments/{id}`), not the concrete path.
    pub route: String,
    /// Request headers in order; only the configured names are used.
    pub headers: Vec<Header>,
    /// The `Content-Type` value, if any; JSON media types get a canonical body.
    pub content_type: Option<String>,
    /// The raw body bytes.
    pub body: Vec<u8>,
}

/// How fingerprints are computed (core `FingerprintConfig`). Client and server must agree.
#[derive(Clone, PartialEq, Eq, uniffi::Record)]
pub struct FingerprintConfig {
    /// Header names that take part (case-insensitive).
    pub header_names: Vec<String>,
    /// RFC 6901 pointers of JSON values left out.
    pub exclude: Vec<String>,
    /// Number policy for JSON bodies.
    pub numbers: NumberMode,
    /// Largest accepted JSON body, in bytes.
    pub max_input_bytes: u64,
    /// Deepest accepted JSON nesting.
    pub max_depth: u64,
    /// Most members accepted in one JSON object.
    pub max_members: u64,
    /// HMAC-SHA256 key (`h1:` fingerprints) instead of bare SHA-256 (`v1:`); never empty.
    pub hmac_key: Option<Vec<u8>>,
}

impl std::fmt::Debug for FingerprintConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FingerprintConfig")
            .field("header_names", &self.header_names)
            .field("exclude", &self.exclude)
            .field("numbers", &self.numbers)
            .field("hmac_key", &self.hmac_key.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// Why a fingerprint could not be computed or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum FingerprintError {
    /// The body is declared JSON but core refuses it (syntax, duplicates, precision loss, limits).
    #[error("{message}")]
    InvalidBody {
        /// Core's stable snake_case code, e.g. `precision_loss`.
        code: String,
        /// Core's message.
        message: String,
        /// Byte offset into the body.
        offset: u64,
        /// RFC 6901 pointer of the value concerned, when inside a value.
        pointer: Option<String>,
    },
    /// The configuration is unusable (bad exclusion pointer, empty HMAC key, bad header name).
    #[error("{message}")]
    InvalidConfig {
        /// Core's stable snake_case code, e.g. `empty_hmac_key`.
        code: String,
        /// Core's message.
        message: String,
    },
    /// A fingerprint text is not `v1:`/`h1:` followed by 64 lowercase hex characters.
    #[error("{message}")]
    InvalidFingerprint {
        /// Core's stable snake_case code, e.g. `unknown_fingerprint_version`.
        code: String,
        /// Core's message.
        message: String,
    },
}

impl From<core::FingerprintError> for FingerprintError {
    fn from(e: core::FingerprintError) -> Self {
        let code = e.code().to_owned();
        let message = e.to_string();
        match e {
            core::FingerprintError::Body(body) => FingerprintError::InvalidBody {
                code,
                message,
                offset: to_u64(body.offset),
                pointer: body.pointer,
            },
            _ => FingerprintError::InvalidConfig { code, message },
        }
    }
}

impl From<core::ParseFingerprintError> for FingerprintError {
    fn from(e: core::ParseFingerprintError) -> Self {
        FingerprintError::InvalidFingerprint {
            code: e.code().to_owned(),
            message: e.to_string(),
        }
    }
}

impl From<core::FingerprintConfig> for FingerprintConfig {
    fn from(c: core::FingerprintConfig) -> Self {
        FingerprintConfig {
            header_names: c.header_names,
            exclude: c.exclude,
            numbers: c.numbers.into(),
            max_input_bytes: to_u64(c.limits.max_input_bytes),
            max_depth: to_u64(c.limits.max_depth),
            max_members: to_u64(c.limits.max_members),
            hmac_key: c.hmac_key,
        }
    }
}

impl From<FingerprintConfig> for core::FingerprintConfig {
    fn from(c: FingerprintConfig) -> Self {
        core::FingerprintConfig {
            header_names: c.header_names,
            exclude: c.exclude,
            numbers: c.numbers.into(),
            limits: Limits {
                max_input_bytes: to_usize(c.max_input_bytes),
                max_depth: to_usize(c.max_depth),
                max_members: to_usize(c.max_members),
            },
            hmac_key: c.hmac_key,
        }
    }
}

/// Core's default fingerprint configuration: no headers, no exclusions, precision-loss numbers
/// refused, default limits, plain SHA-256 (`v1:`).
#[must_use]
#[uniffi::export]
pub fn default_fingerprint_config() -> FingerprintConfig {
    core::FingerprintConfig::default().into()
}

/// The fingerprint of `request` under `config`, as text (`v1:<hex>` or `h1:<hex>`).
///
/// # Errors
/// `InvalidConfig` for an unusable configuration, `InvalidBody` for a JSON body core refuses.
#[uniffi::export]
pub fn fingerprint(
    request: FingerprintRequest,
    config: FingerprintConfig,
) -> Result<String, FingerprintError> {
    let headers: Vec<(&str, &str)> = request
        .headers
        .iter()
        .map(|h| (h.name.as_str(), h.value.as_str()))
        .collect();
    let parts = core::RequestParts {
        method: &request.method,
        route: &request.route,
        headers: &headers,
        content_type: request.content_type.as_deref(),
        body: &request.body,
    };
    Ok(core::fingerprint(&parts, &config.into())?.to_string())
}

/// Validates a fingerprint text and returns it unchanged.
///
/// # Errors
/// `InvalidFingerprint` when it is not `v1:`/`h1:` plus 64 lowercase hex characters.
#[uniffi::export]
pub fn parse_fingerprint(text: String) -> Result<String, FingerprintError> {
    let fp: core::Fingerprint = text.parse()?;
    Ok(fp.to_string())
}

/// Compares two fingerprint texts in constant time (same kind and digest).
///
/// # Errors
/// `InvalidFingerprint` when either text is not a fingerprint.
#[uniffi::export]
pub fn fingerprints_equal(a: String, b: String) -> Result<bool, FingerprintError> {
    let a: core::Fingerprint = a.parse()?;
    let b: core::Fingerprint = b.parse()?;
    Ok(a.ct_eq(&b))
}

/// Whether a `Content-Type` value is a JSON media type (`application/json` or any `type/subtype+json`), i.e.
/// whether the fingerprint canonicalizes the body.
#[must_use]
#[uniffi::export]
pub fn is_json_media_type(content_type: String) -> bool {
    core::is_json_media_type(&content_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_request(method: &str, body: &[u8]) -> FingerprintRequest {
        FingerprintRequest {
            method: method.to_owned(),
            route: "/payments".to_owned(),
            headers: vec![],
            content_type: Some("application/json".to_owned()),
            body: body.to_vec(),
        }
    }

    #[test]
    fn same_meaning_same_fingerprint() {
        let cfg = default_fingerprint_config();
        let a = fingerprint(
            json_request("post", br#"{"amount":100,"currency":"EUR"}"#),
            cfg.clone(),
        );
        let b = fingerprint(
            json_request("POST", br#"{ "currency":"EUR", "amount":1e2 }"#),
            cfg.clone(),
        );
        let c = fingerprint(
            json_request("POST", br#"{"amount":101,"currency":"EUR"}"#),
            cfg,
        );
        let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.starts_with("v1:") && a.len() == 67);
        assert!(fingerprints_equal(a.clone(), b).unwrap());
        assert_eq!(parse_fingerprint(a.clone()).unwrap(), a);
    }

    #[test]
    fn hmac_and_headers_change_the_fingerprint() {
        let mut cfg = default_fingerprint_config();
        let plain = fingerprint(json_request("POST", b"{}"), cfg.clone()).unwrap();
        cfg.hmac_key = Some(b"server-secret".to_vec());
        let keyed = fingerprint(json_request("POST", b"{}"), cfg.clone()).unwrap();
        assert!(keyed.starts_with("h1:"));
        assert_ne!(plain[3..], keyed[3..]);
        cfg.hmac_key = Some(vec![]);
        let err = fingerprint(json_request("POST", b"{}"), cfg).unwrap_err();
        assert!(
            matches!(err, FingerprintError::InvalidConfig { ref code, .. } if code == "empty_hmac_key")
        );

        let mut cfg = default_fingerprint_config();
        cfg.header_names = vec!["X-Tenant".to_owned()];
        let mut req = json_request("POST", b"{}");
        let none = fingerprint(req.clone(), cfg.clone()).unwrap();
        req.headers.push(Header {
            name: "x-tenant".to_owned(),
            value: " acme ".to_owned(),
        });
        let with = fingerprint(req, cfg).unwrap();
        assert_ne!(none, with);
    }

    #[test]
    fn bad_bodies_and_texts_are_typed() {
        let err = fingerprint(
            json_request("POST", b"9007199254740993"),
            default_fingerprint_config(),
        )
        .unwrap_err();
        assert!(
            matches!(err, FingerprintError::InvalidBody { ref code, .. } if code == "precision_loss")
        );
        let mut cfg = default_fingerprint_config();
        cfg.max_depth = 1;
        let err = fingerprint(json_request("POST", b"[[1]]"), cfg).unwrap_err();
        match err {
            FingerprintError::InvalidBody { code, .. } => assert_eq!(code, "depth_limit"),
            other => panic!("unexpected {other:?}"),
        }
        let err = parse_fingerprint("v2:00".to_owned()).unwrap_err();
        assert!(
            matches!(err, FingerprintError::InvalidFingerprint { ref code, .. } if code == "unknown_fingerprint_version")
        );
        assert!(fingerprints_equal("v1:zz".to_owned(), "v1:zz".to_owned()).is_err());
    }

    #[test]
    fn non_json_bodies_are_hashed_raw() {
        let mut req = json_request("POST", b"a=1&b=2");
        req.content_type = Some("application/x-www-form-urlencoded".to_owned());
        assert!(fingerprint(req, default_fingerprint_config()).is_ok());
        assert!(is_json_media_type(
            "application/problem+json; charset=utf-8".to_owned()
        ));
        assert!(!is_json_media_type("text/plain".to_owned()));
    }

    #[test]
    fn config_round_trips_through_core() {
        let back: core::FingerprintConfig = default_fingerprint_config().into();
        assert_eq!(back, core::FingerprintConfig::default());
    }
}
