//! The principal from a verified JWT: `[principal] jwt = { ... }`.
//!
//! The keys come from a JWKS file read at start ([`JwtVerifier::load`]) and read again when it
//! changes ([`JwtVerifier::reload`]: the gateway checks it every `reload_s` seconds and on
//! `SIGHUP`, so a rotated key set is picked up without a restart; a file that fails to load then
//! keeps the last good keys and is logged). Only asymmetric
//! algorithms are accepted (RSA, RSA-PSS, ECDSA P-256/P-384, Ed25519): never `none`, never
//! HMAC. A token is taken from `<header>: Bearer <token>`; its key is the JWKS key named by its
//! `kid`, or, when it has none, the JWKS's only key of the algorithm's type. The signature,
//! `exp` (required), `nbf` (when present; both with the configured leeway), `iss` and `aud`
//! (both required) are checked before the configured claim is read.
//!
//! The gateway does not decide what happens to a request whose principal does not resolve:
//! a token that does not verify is an authentication failure ([`TokenError`], answered 401 by
//! [`unauthorized`], with nothing forwarded); a verified token whose claim is missing, empty or
//! not a string is handed to core's scope stage like any other scope function's result
//! ([`Claim`]), which refuses it.
use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::SystemTime;

use hyper::HeaderMap;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use crate::body::{BoxBody, to_hyper};

/// Default header carrying `Bearer <token>`.
pub const DEFAULT_HEADER: &str = "authorization";
/// Default claim naming the principal.
pub const DEFAULT_CLAIM: &str = "sub";
/// Default clock leeway for `exp` and `nbf`, in seconds.
pub const DEFAULT_LEEWAY_S: u64 = 30;
/// The largest leeway accepted, in seconds.
pub const MAX_LEEWAY_S: u64 = 600;
/// Default interval between two checks of the JWKS file for a change, in seconds.
pub const DEFAULT_RELOAD_S: u64 = 60;
/// The algorithms a configuration may name.
pub const SUPPORTED_ALGORITHMS: &[&str] = &[
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

/// What the verifier is configured with (`[principal] jwt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtSettings {
    /// The JWKS file (relative paths are relative to the working directory).
    pub jwks_file: PathBuf,
    /// The accepted `iss`.
    pub issuer: String,
    /// The accepted `aud` values (a token's `aud` must contain one of them).
    pub audience: Vec<String>,
    /// The claim whose string value is the principal.
    pub claim: String,
    /// The accepted algorithms (asymmetric only).
    pub algorithms: Vec<Algorithm>,
    /// Clock leeway for `exp` and `nbf`, in seconds.
    pub leeway_s: u64,
    /// The request header carrying `Bearer <token>`.
    pub header: String,
    /// Seconds between two checks of the JWKS file for a change (0: only on `SIGHUP`).
    pub reload_s: u64,
}

/// An algorithm name a configuration cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AlgorithmError {
    /// `none`: an unsigned token is never a principal.
    #[error("{0:?}: unsigned tokens are never accepted")]
    None(String),
    /// An HMAC algorithm: the JWKS holds public keys, a shared secret is not supported.
    #[error(
        "{0:?}: symmetric (HMAC) algorithms are not supported; use an asymmetric one ({list})",
        list = SUPPORTED_ALGORITHMS.join(", ")
    )]
    Symmetric(String),
    /// Not a JWS algorithm name.
    #[error("{0:?} is not a supported algorithm (expected one of {list})", list = SUPPORTED_ALGORITHMS.join(", "))]
    Unknown(String),
}

/// The algorithm named `name`, if a configuration may use it.
///
/// # Errors
/// [`AlgorithmError`] for `none`, HMAC or an unknown name.
pub fn parse_algorithm(name: &str) -> Result<Algorithm, AlgorithmError> {
    if name.eq_ignore_ascii_case("none") {
        return Err(AlgorithmError::None(name.to_owned()));
    }
    if !SUPPORTED_ALGORITHMS.contains(&name) {
        return Err(if name.starts_with("HS") {
            AlgorithmError::Symmetric(name.to_owned())
        } else {
            AlgorithmError::Unknown(name.to_owned())
        });
    }
    name.parse::<Algorithm>()
        .map_err(|_| AlgorithmError::Unknown(name.to_owned()))
}

/// Why the JWKS file cannot be used; the gateway does not start.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a JSON object with a `keys` array.
    #[error("{path} is not a JWKS (a JSON object with a \"keys\" array): {why}")]
    NotJwks {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// One key cannot be used.
    #[error("{path}: key #{index}{kid}: {why}")]
    BadKey {
        /// The file.
        path: String,
        /// 1-based position in `keys`.
        index: usize,
        /// ` (kid "...")`, or empty when the key has none.
        kid: String,
        /// What is wrong.
        why: String,
    },
    /// No signature key, or none usable with the configured algorithms.
    #[error("{path} has no key that can verify {algorithms}")]
    NoUsableKey {
        /// The file.
        path: String,
        /// The configured algorithms.
        algorithms: String,
    },
}

/// The type of key an algorithm verifies with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    P256,
    P384,
    Ed25519,
}

fn kind_of(alg: Algorithm) -> Option<KeyKind> {
    match alg {
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => Some(KeyKind::Rsa),
        Algorithm::ES256 => Some(KeyKind::P256),
        Algorithm::ES384 => Some(KeyKind::P384),
        Algorithm::EdDSA => Some(KeyKind::Ed25519),
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => None,
    }
}

struct VerifyKey {
    kid: Option<String>,
    kind: KeyKind,
    /// The key's own `alg`, when the JWKS names one: the only algorithm it verifies.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

impl VerifyKey {
    fn fits(&self, alg: Algorithm) -> bool {
        kind_of(alg) == Some(self.kind) && self.alg.is_none_or(|a| a == alg)
    }
}

/// What identifies one version of the JWKS file without reading it: its modification time and
/// length (a rotation that rewrites the file, or swaps a symlink to it, changes one of them).
type Stamp = Option<(SystemTime, u64)>;

fn stamp_of(path: &std::path::Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// What [`JwtVerifier::reload`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// The file has not changed since it was last read: the keys stay.
    Unchanged,
    /// The file was read again and its keys replace the previous ones.
    Loaded {
        /// Keys now in use.
        keys: usize,
    },
}

/// Verifies bearer tokens against the keys of one JWKS file.
pub struct JwtVerifier {
    settings: JwtSettings,
    keys: RwLock<Arc<Vec<VerifyKey>>>,
    /// The file version last read (loaded or refused), so an unchanged file is not read again.
    seen: Mutex<Stamp>,
}

impl fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("settings", &self.settings)
            .field(
                "kids",
                &self
                    .keys()
                    .iter()
                    .map(|k| k.kid.clone())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Why a request's token does not verify: an authentication failure, answered by
/// [`unauthorized`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The request has no token header.
    #[error("no {0} header")]
    Missing(String),
    /// The request has several token header fields.
    #[error("several {0} headers")]
    Several(String),
    /// The header is not `Bearer <token>`.
    #[error("the {0} header is not \"Bearer <token>\"")]
    NotBearer(String),
    /// The token is not a JWT (three base64url parts, a JSON header and claims).
    #[error("the token is not a well-formed JWT")]
    Malformed,
    /// The token's algorithm is not configured (or does not fit the key it names).
    #[error("the token's algorithm {0} is not accepted")]
    AlgorithmNotAllowed(String),
    /// The token's `kid` is not in the JWKS.
    #[error("the token's key {0:?} is not in the JWKS")]
    UnknownKey(String),
    /// The token has no `kid` and the JWKS has no single key of the algorithm's type.
    #[error("the token names no key and the JWKS has no single key for its algorithm")]
    NoKeyId,
    /// The signature does not verify with the key.
    #[error("the token's signature is not valid")]
    BadSignature,
    /// `exp` is past (beyond the leeway).
    #[error("the token has expired")]
    Expired,
    /// `nbf` is ahead (beyond the leeway).
    #[error("the token is not valid yet")]
    NotYetValid,
    /// `iss` is not the configured issuer.
    #[error("the token's issuer is not accepted")]
    WrongIssuer,
    /// `aud` names none of the configured audiences.
    #[error("the token's audience is not accepted")]
    WrongAudience,
    /// A required registered claim (`exp`, `iss`, `aud`) is absent.
    #[error("the token has no {0} claim")]
    MissingClaim(String),
}

impl TokenError {
    /// The HTTP status: 400 for a request with several tokens (RFC 6750 `invalid_request`),
    /// 401 otherwise.
    #[must_use]
    pub fn status(&self) -> u16 {
        match self {
            Self::Several(_) => 400,
            _ => 401,
        }
    }

    /// The `WWW-Authenticate` challenge (RFC 6750 §3): no error code when the request has no
    /// bearer token at all.
    #[must_use]
    pub fn challenge(&self) -> String {
        match self {
            Self::Missing(_) | Self::NotBearer(_) => "Bearer".to_owned(),
            Self::Several(_) => "Bearer error=\"invalid_request\"".to_owned(),
            // Display texts hold no `"` or `\` except the kid, which is not echoed here.
            Self::UnknownKey(_) => {
                "Bearer error=\"invalid_token\", error_description=\"unknown key\"".to_owned()
            }
            other => format!(
                "Bearer error=\"invalid_token\", error_description=\"{}\"",
                other.to_string().replace(['"', '\\'], "")
            ),
        }
    }
}

/// What a verified token says about the principal, for core's scope stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The claim's string value (possibly empty: core decides).
    Principal(String),
    /// The claim is absent or `null`.
    Absent,
    /// The claim is not a string; the text names its JSON type.
    NotAString(&'static str),
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

impl JwtVerifier {
    /// Reads the JWKS file of `settings` and keeps the keys usable with its algorithms.
    /// Keys whose `use` is not `sig` are skipped.
    ///
    /// # Errors
    /// [`JwksError`] when the file cannot be read, is not a JWKS, holds a key that cannot be
    /// used (symmetric, an unsupported curve, malformed, a `kid` twice), or has no key for
    /// any configured algorithm.
    pub fn load(settings: JwtSettings) -> Result<Self, JwksError> {
        let seen = stamp_of(&settings.jwks_file);
        let keys = read_keys(&settings)?;
        Ok(Self {
            settings,
            keys: RwLock::new(Arc::new(keys)),
            seen: Mutex::new(seen),
        })
    }

    /// Reads the JWKS file again when it changed since it was last read (or always, with
    /// `force`), and replaces the keys with its keys. A file that cannot be used (as
    /// [`JwtVerifier::load`] would refuse it) leaves the keys in use as they are: tokens go on
    /// verifying with the last good set, and the file is read again once it changes.
    ///
    /// # Errors
    /// [`JwksError`] when the changed file cannot be used; the previous keys stay.
    pub fn reload(&self, force: bool) -> Result<Reload, JwksError> {
        let stamp = stamp_of(&self.settings.jwks_file);
        {
            let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            if !force && stamp.is_some() && *seen == stamp {
                return Ok(Reload::Unchanged);
            }
            *seen = stamp;
        }
        let keys = read_keys(&self.settings)?;
        let count = keys.len();
        *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(keys);
        Ok(Reload::Loaded { keys: count })
    }

    fn keys(&self) -> Arc<Vec<VerifyKey>> {
        Arc::clone(&self.keys.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The settings.
    #[must_use]
    pub fn settings(&self) -> &JwtSettings {
        &self.settings
    }

    /// Keys loaded.
    #[must_use]
    pub fn key_count(&self) -> usize {
        self.keys().len()
    }

    /// Verifies the bearer token in `headers` and reads the configured claim.
    ///
    /// # Errors
    /// [`TokenError`] when there is no single bearer token or it does not verify.
    pub fn verify(&self, headers: &HeaderMap) -> Result<Claim, TokenError> {
        let name = self.settings.header.as_str();
        let mut values = headers.get_all(name).iter();
        let value = match (values.next(), values.next()) {
            (None, _) => return Err(TokenError::Missing(name.to_owned())),
            (Some(_), Some(_)) => return Err(TokenError::Several(name.to_owned())),
            (Some(v), None) => v,
        };
        let not_bearer = || TokenError::NotBearer(name.to_owned());
        let value = value.to_str().map_err(|_| not_bearer())?;
        let (scheme, token) = value.trim().split_once(' ').ok_or_else(not_bearer)?;
        let token = token.trim();
        if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
            return Err(not_bearer());
        }
        self.verify_token(token)
    }

    /// Verifies one compact JWS `token` and reads the configured claim.
    ///
    /// # Errors
    /// [`TokenError`] when it does not verify.
    pub fn verify_token(&self, token: &str) -> Result<Claim, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        let alg = header.alg;
        if !self.settings.algorithms.contains(&alg) {
            return Err(TokenError::AlgorithmNotAllowed(format!("{alg:?}")));
        }
        let keys = self.keys();
        let key = match &header.kid {
            Some(kid) => {
                let key = keys
                    .iter()
                    .find(|k| k.kid.as_deref() == Some(kid.as_str()))
                    .ok_or_else(|| TokenError::UnknownKey(kid.clone()))?;
                if !key.fits(alg) {
                    return Err(TokenError::AlgorithmNotAllowed(format!("{alg:?}")));
                }
                key
            }
            None => {
                let mut fitting = keys.iter().filter(|k| k.fits(alg));
                match (fitting.next(), fitting.next()) {
                    (Some(k), None) => k,
                    _ => return Err(TokenError::NoKeyId),
                }
            }
        };
        let mut v = Validation::new(alg);
        v.leeway = self.settings.leeway_s;
        v.validate_exp = true;
        v.validate_nbf = true;
        v.validate_aud = true;
        v.set_issuer(&[self.settings.issuer.as_str()]);
        v.set_audience(&self.settings.audience);
        v.required_spec_claims = ["exp", "iss", "aud"]
            .into_iter()
            .map(str::to_owned)
            .collect::<HashSet<_>>();
        let data =
            jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(token, &key.key, &v)
                .map_err(|e| token_error(&e))?;
        Ok(match data.claims.get(&self.settings.claim) {
            None | Some(serde_json::Value::Null) => Claim::Absent,
            Some(serde_json::Value::String(s)) => Claim::Principal(s.clone()),
            Some(other) => Claim::NotAString(json_type(other)),
        })
    }
}

fn token_error(e: &jsonwebtoken::errors::Error) -> TokenError {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::ExpiredSignature => TokenError::Expired,
        K::ImmatureSignature => TokenError::NotYetValid,
        K::InvalidIssuer => TokenError::WrongIssuer,
        K::InvalidAudience => TokenError::WrongAudience,
        K::MissingRequiredClaim(c) => TokenError::MissingClaim(c.clone()),
        K::InvalidAlgorithm | K::MissingAlgorithm | K::InvalidAlgorithmName => {
            TokenError::AlgorithmNotAllowed("(mismatch with its key)".to_owned())
        }
        K::InvalidSignature
        | K::InvalidEcdsaKey
        | K::InvalidRsaKey(_)
        | K::Crypto(_)
        | K::InvalidKeyFormat => TokenError::BadSignature,
        _ => TokenError::Malformed,
    }
}

/// The keys of `settings`' JWKS file, refused when none fits a configured algorithm.
fn read_keys(settings: &JwtSettings) -> Result<Vec<VerifyKey>, JwksError> {
    let path = settings.jwks_file.display().to_string();
    let text = std::fs::read_to_string(&settings.jwks_file).map_err(|source| JwksError::Read {
        path: path.clone(),
        source,
    })?;
    let keys = parse_jwks(&path, &text)?;
    if !keys
        .iter()
        .any(|k| settings.algorithms.iter().any(|a| k.fits(*a)))
    {
        return Err(JwksError::NoUsableKey {
            path,
            algorithms: algorithm_list(&settings.algorithms),
        });
    }
    Ok(keys)
}

fn algorithm_list(algs: &[Algorithm]) -> String {
    algs.iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn parse_jwks(path: &str, text: &str) -> Result<Vec<VerifyKey>, JwksError> {
    let not_jwks = |why: String| JwksError::NotJwks {
        path: path.to_owned(),
        why,
    };
    let doc: serde_json::Value = serde_json::from_str(text).map_err(|e| not_jwks(e.to_string()))?;
    let list = doc
        .get("keys")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| not_jwks("no \"keys\" array".to_owned()))?;
    let mut keys: Vec<VerifyKey> = Vec::with_capacity(list.len());
    for (i, raw) in list.iter().enumerate() {
        let kid = raw
            .get("kid")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        let bad = |why: String| JwksError::BadKey {
            path: path.to_owned(),
            index: i + 1,
            kid: kid
                .as_ref()
                .map_or_else(String::new, |k| format!(" (kid {k:?})")),
            why,
        };
        if let Some(u) = raw.get("use").and_then(serde_json::Value::as_str) {
            if u != "sig" {
                continue;
            }
        }
        if raw.get("kty").and_then(serde_json::Value::as_str) == Some("oct") {
            return Err(bad(
                "symmetric (oct) keys are not supported: the JWKS must hold public keys".to_owned(),
            ));
        }
        let jwk: Jwk = serde_json::from_value(raw.clone())
            .map_err(|e| bad(format!("not a usable JWK ({e})")))?;
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let kind = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => KeyKind::Rsa,
            AlgorithmParameters::EllipticCurve(p) => match p.curve {
                EllipticCurve::P256 => KeyKind::P256,
                EllipticCurve::P384 => KeyKind::P384,
                ref other => return Err(bad(format!("curve {other:?} is not supported"))),
            },
            AlgorithmParameters::OctetKeyPair(p) => match p.curve {
                EllipticCurve::Ed25519 => KeyKind::Ed25519,
                ref other => return Err(bad(format!("curve {other:?} is not supported"))),
            },
            AlgorithmParameters::OctetKey(_) => {
                return Err(bad(
                    "symmetric (oct) keys are not supported: the JWKS must hold public keys"
                        .to_owned(),
                ));
            }
        };
        let alg = match raw.get("alg").and_then(serde_json::Value::as_str) {
            None => None,
            Some(name) => {
                let a = parse_algorithm(name).map_err(|e| bad(format!("alg: {e}")))?;
                if kind_of(a) != Some(kind) {
                    return Err(bad(format!("alg {name} does not fit a {kind:?} key")));
                }
                Some(a)
            }
        };
        if let Some(k) = &kid {
            if keys.iter().any(|o| o.kid.as_ref() == Some(k)) {
                return Err(bad("the kid is used by an earlier key".to_owned()));
            }
        }
        let key =
            DecodingKey::from_jwk(&jwk).map_err(|e| bad(format!("not a usable key ({e})")))?;
        keys.push(VerifyKey {
            kid,
            kind,
            alg,
            key,
        });
    }
    if keys.is_empty() {
        return Err(not_jwks("no signature keys".to_owned()));
    }
    Ok(keys)
}

/// The answer to a request whose token does not verify: 401 (400 for several tokens) with
/// the RFC 6750 `WWW-Authenticate` challenge and an RFC 9457 problem body (`about:blank`:
/// this is HTTP authentication, not an idempotency problem, so none of core's problem types
/// applies). Nothing is forwarded.
#[must_use]
pub fn unauthorized(e: &TokenError) -> hyper::Response<BoxBody> {
    let status = e.status();
    let title = if status == 400 {
        "Bad Request"
    } else {
        "Unauthorized"
    };
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": format!("The request's bearer token was refused: {e}."),
    });
    to_hyper(idempo_core::machine::HttpResponse {
        status,
        headers: vec![
            (
                "content-type".to_owned(),
                idempo_core::machine::problem::PROBLEM_CONTENT_TYPE.to_owned(),
            ),
            ("www-authenticate".to_owned(), e.challenge()),
        ],
        body: body.to_string().into_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_names() {
        assert_eq!(parse_algorithm("RS256"), Ok(Algorithm::RS256));
        assert_eq!(parse_algorithm("EdDSA"), Ok(Algorithm::EdDSA));
        assert!(matches!(
            parse_algorithm("none"),
            Err(AlgorithmError::None(_))
        ));
        assert!(matches!(
            parse_algorithm("NONE"),
            Err(AlgorithmError::None(_))
        ));
        assert!(matches!(
            parse_algorithm("HS256"),
            Err(AlgorithmError::Symmetric(_))
        ));
        assert!(matches!(
            parse_algorithm("rs256"),
            Err(AlgorithmError::Unknown(_))
        ));
    }

    #[test]
    fn bad_jwks_texts_are_refused() {
        let cases = [
            ("", "not a JWKS"),
            ("[]", "no \"keys\" array"),
            ("{\"keys\":[]}", "no signature keys"),
            (
                "{\"keys\":[{\"kty\":\"oct\",\"k\":\"c2VjcmV0\"}]}",
                "symmetric",
            ),
            (
                "{\"keys\":[{\"kty\":\"RSA\",\"kid\":\"a\"}]}",
                "key #1 (kid \"a\")",
            ),
            (
                "{\"keys\":[{\"kty\":\"RSA\",\"n\":\"AQAB\",\"e\":\"AQAB\",\"alg\":\"ES256\"}]}",
                "does not fit",
            ),
            (
                "{\"keys\":[{\"kty\":\"RSA\",\"n\":\"AQAB\",\"e\":\"AQAB\",\"use\":\"enc\"}]}",
                "no signature keys",
            ),
        ];
        for (text, want) in cases {
            let Err(e) = parse_jwks("k.json", text) else {
                panic!("{text:?} was accepted")
            };
            let msg = e.to_string();
            assert!(msg.contains(want), "{text:?}: {msg}");
            assert!(msg.contains("k.json"), "{msg}");
        }
        let two = "{\"keys\":[{\"kty\":\"RSA\",\"kid\":\"a\",\"n\":\"AQAB\",\"e\":\"AQAB\"},\
                   {\"kty\":\"RSA\",\"kid\":\"a\",\"n\":\"AQAB\",\"e\":\"AQAB\"}]}";
        let Err(e) = parse_jwks("k.json", two) else {
            panic!("a kid twice was accepted")
        };
        assert!(e.to_string().contains("key #2"), "{e}");
    }

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/jwt")
            .join(name)
    }

    fn rsa1() -> jsonwebtoken::EncodingKey {
        use base64::Engine as _;
        let text = std::fs::read_to_string(fixture("rsa1.pem")).expect("fixture");
        let b64: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .expect("base64");
        jsonwebtoken::EncodingKey::from_rsa_der(&der)
    }

    /// The test settings (issuer `iss`, audience `aud`, RS256) on the JWKS file `path`.
    fn settings(path: &std::path::Path) -> JwtSettings {
        JwtSettings {
            jwks_file: path.to_owned(),
            issuer: "iss".to_owned(),
            audience: vec!["aud".to_owned()],
            claim: "sub".to_owned(),
            algorithms: vec![Algorithm::RS256],
            leeway_s: 0,
            header: "authorization".to_owned(),
            reload_s: 0,
        }
    }

    /// A verifier on `jwks` (a JWKS text written to a temporary file).
    fn verifier(tag: &str, jwks: &str) -> JwtVerifier {
        let path =
            std::env::temp_dir().join(format!("idempo-jwt-{tag}-{}.json", std::process::id()));
        std::fs::write(&path, jwks).expect("write");
        let v = JwtVerifier::load(settings(&path)).expect("load");
        let _ = std::fs::remove_file(path);
        v
    }

    #[test]
    fn a_rotated_jwks_is_picked_up_and_a_broken_one_keeps_the_last_good_keys() {
        let path =
            std::env::temp_dir().join(format!("idempo-jwt-rotate-{}.json", std::process::id()));
        let write = |keys: &[serde_json::Value]| {
            std::fs::write(&path, serde_json::json!({ "keys": keys }).to_string()).expect("write");
        };
        write(&[rsa1_jwk("old")]);
        let v = JwtVerifier::load(settings(&path)).expect("load");
        let alice = Ok(Claim::Principal("alice".to_owned()));
        assert_eq!(v.verify_token(&sign(Some("old"))), alice);
        assert_eq!(
            v.verify_token(&sign(Some("new"))),
            Err(TokenError::UnknownKey("new".to_owned()))
        );
        // Unchanged file: not read again.
        assert_eq!(v.reload(false).expect("reload"), Reload::Unchanged);
        // The issuer rotates: both keys published (the file grows, so its stamp changes).
        write(&[rsa1_jwk("old"), rsa1_jwk("new")]);
        assert_eq!(v.reload(false).expect("reload"), Reload::Loaded { keys: 2 });
        assert_eq!(v.verify_token(&sign(Some("new"))), alice);
        assert_eq!(v.key_count(), 2);
        // A broken file (a half-written rotation): refused, the last good keys stay in use.
        std::fs::write(&path, "{\"keys\": [").expect("write");
        let Err(e) = v.reload(false) else {
            panic!("a broken JWKS was accepted")
        };
        assert!(e.to_string().contains("is not a JWKS"), "{e}");
        assert_eq!(v.verify_token(&sign(Some("new"))), alice);
        // The same broken file is not read (nor logged) again until it changes.
        assert_eq!(v.reload(false).expect("unchanged"), Reload::Unchanged);
        // A file with no key at all is refused the same way (forced: read whatever the stamp).
        std::fs::write(&path, serde_json::json!({ "keys": [] }).to_string()).expect("write");
        assert!(v.reload(true).is_err());
        assert_eq!(v.verify_token(&sign(Some("old"))), alice);
        // The old key retired.
        write(&[rsa1_jwk("new")]);
        assert_eq!(v.reload(true).expect("reload"), Reload::Loaded { keys: 1 });
        assert_eq!(
            v.verify_token(&sign(Some("old"))),
            Err(TokenError::UnknownKey("old".to_owned()))
        );
        // A file that went away keeps the keys too.
        let _ = std::fs::remove_file(&path);
        assert!(v.reload(false).is_err());
        assert_eq!(v.verify_token(&sign(Some("new"))), alice);
    }

    fn rsa1_jwk(kid: &str) -> serde_json::Value {
        let text = std::fs::read_to_string(fixture("jwks.json")).expect("fixture");
        let doc: serde_json::Value = serde_json::from_str(&text).expect("json");
        let mut k = doc["keys"][0].clone();
        k["kid"] = serde_json::json!(kid);
        k
    }

    fn sign(kid: Option<&str>) -> String {
        let mut h = jsonwebtoken::Header::new(Algorithm::RS256);
        h.kid = kid.map(str::to_owned);
        let exp = jsonwebtoken::get_current_timestamp() + 60;
        let claims = serde_json::json!({"iss": "iss", "aud": "aud", "sub": "alice", "exp": exp});
        jsonwebtoken::encode(&h, &claims, &rsa1()).expect("sign")
    }

    #[test]
    fn a_token_without_kid_needs_a_single_fitting_key() {
        let one = verifier(
            "one",
            &serde_json::json!({"keys": [rsa1_jwk("a")]}).to_string(),
        );
        assert_eq!(
            one.verify_token(&sign(None)),
            Ok(Claim::Principal("alice".to_owned()))
        );
        let two = verifier(
            "two",
            &serde_json::json!({"keys": [rsa1_jwk("a"), rsa1_jwk("b")]}).to_string(),
        );
        assert_eq!(two.verify_token(&sign(None)), Err(TokenError::NoKeyId));
        assert_eq!(
            two.verify_token(&sign(Some("b"))),
            Ok(Claim::Principal("alice".to_owned()))
        );
        assert_eq!(
            two.verify_token(&sign(Some("c"))),
            Err(TokenError::UnknownKey("c".to_owned()))
        );
    }

    #[test]
    fn the_header_must_be_one_bearer_token() {
        let v = verifier(
            "hdr",
            &serde_json::json!({"keys": [rsa1_jwk("a")]}).to_string(),
        );
        let t = sign(Some("a"));
        let headers = |values: &[String]| {
            let mut h = HeaderMap::new();
            for value in values {
                h.append("authorization", value.parse().expect("value"));
            }
            h
        };
        let ok = Ok(Claim::Principal("alice".to_owned()));
        assert_eq!(v.verify(&headers(&[format!("Bearer {t}")])), ok);
        assert_eq!(v.verify(&headers(&[format!("bearer   {t} ")])), ok);
        let not_bearer = Err(TokenError::NotBearer("authorization".to_owned()));
        assert_eq!(v.verify(&headers(&["Bearer".to_owned()])), not_bearer);
        assert_eq!(v.verify(&headers(&["Bearer  ".to_owned()])), not_bearer);
        assert_eq!(v.verify(&headers(&[format!("Token {t}")])), not_bearer);
        assert_eq!(
            v.verify(&headers(&[])),
            Err(TokenError::Missing("authorization".to_owned()))
        );
        assert_eq!(
            v.verify(&headers(&[format!("Bearer {t}"), format!("Bearer {t}")])),
            Err(TokenError::Several("authorization".to_owned()))
        );
    }

    #[test]
    fn challenges_follow_rfc_6750() {
        assert_eq!(
            TokenError::Missing("authorization".into()).challenge(),
            "Bearer"
        );
        assert_eq!(TokenError::Several("authorization".into()).status(), 400);
        assert_eq!(
            TokenError::Expired.challenge(),
            "Bearer error=\"invalid_token\", error_description=\"the token has expired\""
        );
        assert!(
            !TokenError::UnknownKey("\"x\\".into())
                .challenge()
                .contains('\\')
        );
    }
}
