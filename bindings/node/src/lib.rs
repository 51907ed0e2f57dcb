//! Node.js binding of idempo-core (built with napi-rs, loaded by the `idempo` npm package).
//!
//! Thin by design: every function converts JavaScript values to core types, calls core and
//! converts back. Errors are thrown as JS `Error`s with a stable `code` (see [`error`]); the
//! TypeScript layer maps them to `Error` subclasses. Every export uses `catch_unwind`, so a panic
//! becomes a JS exception instead of aborting the process.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// napi-derive needs its exports `pub`; they live in private modules and are reached through the
// registration it generates, which `unreachable_pub` cannot see.
#![allow(unreachable_pub)]
// napi-derive registers exports only outside `cfg(test)`; clippy's test build sees them unused.
#![cfg_attr(test, allow(dead_code))]

mod admit;
mod busy;
mod cache;
mod call;
mod canonical;
mod error;
mod fingerprint;
mod flow;
mod gate;
mod inline;
mod intent;
mod jsbuf;
mod key;
mod memstore;
mod metrics;
mod num;
mod options;
mod recipes;
mod record;
mod redis_check;
mod retry;
mod scope;
mod strarg;

use napi_derive::napi;

/// The version of the native addon (the workspace version).
#[napi]
#[must_use]
pub fn native_version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
