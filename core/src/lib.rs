//! # idempo-core
//!
//! The pure core of idempo, the library that makes "charge this card" safe to retry.
//!
//! ## Purity contract
//!
//! This crate performs **no IO, reads no clock, draws no randomness, spawns no threads and has no
//! async code**. Time (`now`, in milliseconds on the store's clock) and entropy (fencing tokens,
//! jitter samples, fresh keys) are always parameters supplied by the host. Every function is a
//! deterministic map from its inputs to plain data, which is what lets the same decisions be
//! model-checked (`stateright`), property-tested (`proptest`) and driven from Python, Node and Swift
//! with identical results. (A prepared `Fingerprinter` reuses its working memory behind a lock it
//! only *tries* to take: a busy lock means fresh memory, never waiting, and never a different
//! result.)
//!
//! ## Modules
//!
//! - [`canonical`]: RFC 8785 (JCS) canonical JSON with strict input validation and limits.
//! - [`fingerprint`]: the versioned request fingerprint (SHA-256 or HMAC-SHA256).
//! - [`key`]: `Idempotency-Key` header parsing and validation.
//! - [`scope`]: collision-free scope ids from (principal, method, route, key).
//! - [`retry`]: the client retry policy shared by every binding's client helper.
//! - [`intent`]: client intents: the pending-key record, the request binding and when a stop
//!   settles the intent.
//! - [`record`]: the stored record and its versioned encoding.
//! - [`recipes`]: the store recipes of `spec/STORAGE.md` (SQL and Lua texts) every binding runs.
//! - [`policy`]: per-route lease, takeover, response-caching and retention policy.
//! - [`machine`]: the key state machine: `decide`, completion, takeover and the sans-IO server flow.
//! - [`vocab`]: the stable names of core's enumerations (`FromStr`, `as_str`, `Display`).
//! - [`metrics`]: the fixed shapes of the metrics every binding exports (histogram bounds).
//! - [`options`]: the host and store options every binding shares: one name, one default.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod busy;
pub mod canonical;
pub mod fingerprint;
pub mod intent;
pub mod key;
pub mod machine;
pub mod metrics;
pub mod options;
pub mod policy;
pub mod recipes;
pub mod record;
pub mod redis_check;
pub mod retry;
pub mod scope;
pub mod vocab;
