//! Node.js binding of idempo-core.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use napi_derive::napi;

/// The version of the native addon (the workspace version).
#[napi]
#[must_use]
pub fn native_version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
