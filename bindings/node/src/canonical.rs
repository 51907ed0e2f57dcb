//! RFC 8785 canonical JSON.
use idempo_core::canonical::{self, CanonError, CanonOptions, Exclusions, Limits, NumberMode};
use napi::Env;
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

use crate::error::{Detail, Fail, code, num};

/// Options of `canonicalize`.
#[napi(object)]
#[derive(Default)]
pub struct CanonicalizeOptions {
    /// `"rfc"` (default: round to the nearest double, as RFC 8785) or `"reject_precision_loss"`.
    pub numbers: Option<String>,
    /// Maximum input size in bytes (default 8 MiB).
    pub max_input_bytes: Option<u32>,
    /// Maximum nesting depth (default 128).
    pub max_depth: Option<u32>,
    /// Maximum number of members and elements (default 100000).
    pub max_members: Option<u32>,
    /// RFC 6901 pointers of values to leave out of the output.
    pub exclude: Option<Vec<String>>,
}

/// Parses a number mode name (core's vocabulary: `NumberMode: FromStr`).
pub(crate) fn number_mode(name: Option<&str>) -> Result<Option<NumberMode>, Fail> {
    name.map(|n| {
        n.parse::<NumberMode>()
            .map_err(|e| Fail::new(code::INVALID_ARGUMENT, e.to_string()))
    })
    .transpose()
}

/// Builds core limits from optional overrides.
pub(crate) fn limits(
    max_input_bytes: Option<u32>,
    max_depth: Option<u32>,
    max_members: Option<u32>,
) -> Limits {
    let d = Limits::default();
    Limits {
        max_input_bytes: max_input_bytes.map_or(d.max_input_bytes, |v| v as usize),
        max_depth: max_depth.map_or(d.max_depth, |v| v as usize),
        max_members: max_members.map_or(d.max_members, |v| v as usize),
    }
}

fn options(opts: Option<&CanonicalizeOptions>) -> Result<CanonOptions, Fail> {
    let Some(o) = opts else {
        return Ok(CanonOptions::default());
    };
    Ok(CanonOptions {
        limits: limits(o.max_input_bytes, o.max_depth, o.max_members),
        numbers: number_mode(o.numbers.as_deref())?.unwrap_or_default(),
    })
}

/// The `CANONICALIZATION_ERROR` for a core error (reason, offset, pointer).
pub(crate) fn canon_fail(e: &CanonError) -> Fail {
    Fail::new(code::CANONICALIZATION, e.to_string())
        .reason(e.code())
        .with("offset", num(e.offset))
        .with(
            "pointer",
            e.pointer.clone().map_or(Detail::Null, Detail::Str),
        )
}

fn run(env: &Env, input: &[u8], opts: Option<&CanonicalizeOptions>) -> napi::Result<Buffer> {
    let o = options(opts).map_err(|f| f.throw(env))?;
    let exclude = opts.and_then(|x| x.exclude.as_ref());
    match exclude {
        None => canonical::canonicalize_with(input, &o)
            .map(Buffer::from)
            .map_err(|e| canon_fail(&e).throw(env)),
        Some(ptrs) => {
            let ex = Exclusions::new(ptrs).map_err(|e| {
                Fail::new(code::INVALID_ARGUMENT, e.to_string())
                    .reason(e.code())
                    .throw(env)
            })?;
            let mut out = Vec::with_capacity(input.len());
            canonical::canonicalize_excluding_to(input, &o, &ex, &mut out)
                .map(|()| Buffer::from(out))
                .map_err(|e| canon_fail(&e).throw(env))
        }
    }
}

/// Canonicalizes a JSON text given as bytes (UTF-8) into its RFC 8785 form.
#[napi(catch_unwind)]
pub fn canonicalize_bytes(
    env: Env,
    data: &[u8],
    options: Option<CanonicalizeOptions>,
) -> napi::Result<Buffer> {
    run(&env, data, options.as_ref())
}

/// Canonicalizes a JSON text given as a string into its RFC 8785 form.
#[napi(catch_unwind)]
pub fn canonicalize_string(
    env: Env,
    data: String,
    options: Option<CanonicalizeOptions>,
) -> napi::Result<Buffer> {
    run(&env, data.as_bytes(), options.as_ref())
}
