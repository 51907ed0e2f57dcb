//! Errors thrown into JavaScript.
//!
//! Every failure becomes a plain JS `Error` whose `code` is one of the stable idempo codes
//! (`IDEMPOTENCY_KEY_INVALID`, `CANONICALIZATION_ERROR`, ...) and whose extra properties carry the
//! details core reports (`reason` is core's snake_case code; `offset`, `pointer` where known). The
//! TypeScript layer maps `code` to the matching `Error` subclass.
use napi::{Env, Status};

/// A detail attached to a thrown error.
pub(crate) enum Detail {
    /// A string property.
    Str(String),
    /// A number property.
    Num(f64),
    /// An explicit `null`.
    Null,
}

/// A failure to throw into JavaScript.
pub(crate) struct Fail {
    code: &'static str,
    message: String,
    details: Vec<(&'static str, Detail)>,
}

impl Fail {
    /// A failure with the stable `code` and a human message.
    pub(crate) fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// The human message.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// Adds core's snake_case reason code.
    pub(crate) fn reason(self, reason: &str) -> Self {
        self.with("reason", Detail::Str(reason.to_owned()))
    }

    /// Adds a property.
    pub(crate) fn with(mut self, name: &'static str, value: Detail) -> Self {
        self.details.push((name, value));
        self
    }

    /// Throws the error into JavaScript and returns the marker napi-rs expects for an exception
    /// that is already pending.
    pub(crate) fn throw(self, env: &Env) -> napi::Error {
        match self.try_throw(env) {
            Ok(()) => napi::Error::from_status(Status::PendingException),
            // Building the error object failed (out of memory in V8): fall back to napi-rs's
            // own error with the same code.
            Err(_) => napi::Error::new(
                Status::GenericFailure,
                format!("{}: {}", self.code, self.message),
            ),
        }
    }

    fn try_throw(&self, env: &Env) -> napi::Result<()> {
        let mut obj = env.create_error(napi::Error::new(
            Status::GenericFailure,
            self.message.clone(),
        ))?;
        obj.set("code", self.code)?;
        for (name, value) in &self.details {
            match value {
                Detail::Str(s) => obj.set(name, s.as_str())?,
                Detail::Num(n) => obj.set(name, *n)?,
                Detail::Null => obj.set(name, napi::bindgen_prelude::Null)?,
            }
        }
        env.throw(obj)
    }
}

/// Stable codes (the `code` property of thrown errors).
pub(crate) mod code {
    /// The `Idempotency-Key` value is malformed or out of bounds.
    pub(crate) const KEY_INVALID: &str = "IDEMPOTENCY_KEY_INVALID";
    /// A JSON body could not be canonicalized.
    pub(crate) const CANONICALIZATION: &str = "CANONICALIZATION_ERROR";
    /// A fingerprint could not be computed (bad configuration).
    pub(crate) const FINGERPRINT: &str = "FINGERPRINT_ERROR";
    /// The store failed or is full; fail closed.
    pub(crate) const STORE_UNAVAILABLE: &str = "STORE_UNAVAILABLE";
    /// A stored record violates the storage contract.
    pub(crate) const RECORD_CORRUPT: &str = "RECORD_CORRUPT";
    /// An argument is outside its documented domain.
    pub(crate) const INVALID_ARGUMENT: &str = "INVALID_ARGUMENT";
    /// The host fed the server flow an event it cannot accept (a binding bug).
    pub(crate) const FLOW: &str = "FLOW_ERROR";
    /// A configuration value was rejected by core.
    pub(crate) const CONFIG: &str = "CONFIG_INVALID";
}

/// Converts a `usize` for JavaScript (exact below 2^53, which every offset is).
#[allow(clippy::cast_precision_loss)]
pub(crate) fn num(v: usize) -> Detail {
    Detail::Num(v as f64)
}
