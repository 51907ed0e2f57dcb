//! Reading short JS string arguments without a heap allocation.
//!
//! The one module of the workspace allowed `unsafe`: one N-API call into a stack buffer, with
//! its safety argument beside it.
#![allow(unsafe_code)]
use napi::{JsString, JsValue, sys};

/// Stack buffer size for short string arguments (methods, route templates).
pub(crate) const STACK_STR: usize = 256;

/// A string argument: borrowed from a stack buffer when short, owned otherwise.
pub(crate) enum StrArg<'b> {
    /// Fits the stack buffer.
    Stack(&'b str),
    /// Longer strings, copied by napi-rs.
    Heap(String),
}

impl<'b> StrArg<'b> {
    /// Reads `s` as UTF-8 into `buf` when it fits, else into a `String`.
    pub(crate) fn read(s: &JsString<'_>, buf: &'b mut [u8; STACK_STR]) -> napi::Result<Self> {
        let v = s.value();
        let mut len: usize = 0;
        // SAFETY: `v.env` and `v.value` come from the live callback scope of this call and the
        // value was checked to be a string by napi-rs; `buf` is valid for `STACK_STR` bytes and
        // N-API writes at most `STACK_STR - 1` bytes plus a NUL, reporting the count in `len`.
        let status = unsafe {
            sys::napi_get_value_string_utf8(
                v.env,
                v.value,
                buf.as_mut_ptr().cast(),
                STACK_STR,
                &mut len,
            )
        };
        if status != sys::Status::napi_ok {
            return Err(napi::Error::new(
                napi::Status::StringExpected,
                "expected a string",
            ));
        }
        // A result of exactly `STACK_STR - 1` bytes may have been truncated: take the slow path.
        if len < STACK_STR - 1
            && let Some(bytes) = buf.get(..len)
            && let Ok(text) = std::str::from_utf8(bytes)
        {
            return Ok(Self::Stack(text));
        }
        Ok(Self::Heap(s.into_utf8()?.as_str()?.to_owned()))
    }

    /// The text.
    pub(crate) fn as_str(&self) -> &str {
        match self {
            Self::Stack(s) => s,
            Self::Heap(s) => s,
        }
    }
}
