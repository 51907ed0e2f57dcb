//! `Idempotency-Key` parsing and generation.
use idempo_core::key::{self, IdempotencyKey, KeyError, KeyOptions};
use napi::Env;
use napi_derive::napi;

use crate::error::{Fail, code, num};

/// Options of `parseKey`.
#[napi(object)]
#[derive(Default)]
pub struct ParseKeyOptions {
    /// Minimum key length in characters (default 8).
    pub min_len: Option<u32>,
    /// Maximum key length in characters (default 128, at most 255).
    pub max_len: Option<u32>,
    /// Accept only the quoted sf-string form (default false: a bare token is accepted too).
    pub strict: Option<bool>,
}

pub(crate) fn key_options(o: Option<&ParseKeyOptions>) -> Result<KeyOptions, Fail> {
    let Some(o) = o else {
        return Ok(KeyOptions::default());
    };
    let min = o.min_len.map_or(key::DEFAULT_MIN_LEN, |v| v as usize);
    let max = o.max_len.map_or(key::DEFAULT_MAX_LEN, |v| v as usize);
    let opts = KeyOptions::new(min, max)
        .map_err(|e| Fail::new(code::CONFIG, e.to_string()).reason(e.code()))?;
    Ok(opts.with_strict(o.strict.unwrap_or(false)))
}

/// The `IDEMPOTENCY_KEY_INVALID` error for a core key error.
pub(crate) fn key_fail(e: &KeyError) -> Fail {
    let f = Fail::new(code::KEY_INVALID, e.to_string()).reason(e.code());
    match e.offset() {
        Some(o) => f.with("offset", num(o)),
        None => f,
    }
}

/// Parses an `Idempotency-Key` header value (sf-string or, unless strict, a bare token) and
/// returns the key text.
#[napi(catch_unwind)]
pub fn parse_key(
    env: Env,
    value: String,
    options: Option<ParseKeyOptions>,
) -> napi::Result<String> {
    let opts = key_options(options.as_ref()).map_err(|f| f.throw(&env))?;
    key::parse_key(&value, &opts)
        .map(|k| k.as_str().to_owned())
        .map_err(|e| key_fail(&e).throw(&env))
}

/// A parsed key with the form it was sent in.
#[napi(object)]
pub struct ParsedKeyData {
    /// The key text.
    pub key: String,
    /// `"sf_string"` or `"bare"`.
    pub form: String,
    /// How many RFC 9651 parameters followed the sf-string (validated, then ignored).
    pub ignored_parameters: u32,
}

/// Parses a raw header value (bytes as received: Node gives header strings in latin1) and
/// reports the form and ignored parameters.
#[napi(catch_unwind)]
pub fn parse_key_bytes(
    env: Env,
    value: &[u8],
    options: Option<ParseKeyOptions>,
) -> napi::Result<ParsedKeyData> {
    let opts = key_options(options.as_ref()).map_err(|f| f.throw(&env))?;
    key::parse_key_detailed(value, &opts)
        .map(|p| ParsedKeyData {
            key: p.key.as_str().to_owned(),
            form: p.form.as_str().to_owned(),
            ignored_parameters: u32::try_from(p.ignored_parameters).unwrap_or(u32::MAX),
        })
        .map_err(|e| key_fail(&e).throw(&env))
}

/// Makes a fresh key from 16 bytes of host entropy.
#[napi(catch_unwind)]
pub fn generate_key(env: Env, entropy: &[u8]) -> napi::Result<String> {
    let bytes: [u8; 16] = entropy.try_into().map_err(|_| {
        Fail::new(
            code::INVALID_ARGUMENT,
            format!(
                "generateKey needs 16 bytes of entropy, got {}",
                entropy.len()
            ),
        )
        .throw(&env)
    })?;
    Ok(IdempotencyKey::generate(bytes).as_str().to_owned())
}

/// The header value to send for a key (its sf-string form). Any key core can represent (1 to
/// 255 characters) is accepted; the server's own length bounds apply when it parses it.
#[napi(catch_unwind)]
pub fn key_header_value(env: Env, key: String) -> napi::Result<String> {
    let widest = KeyOptions::new(1, key::MAX_LEN_LIMIT).map_err(|e| {
        Fail::new(code::CONFIG, e.to_string())
            .reason(e.code())
            .throw(&env)
    })?;
    IdempotencyKey::from_text(&key, &widest)
        .map(|k| k.to_header_value())
        .map_err(|e| key_fail(&e).throw(&env))
}
