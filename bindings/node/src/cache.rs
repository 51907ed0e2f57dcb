//! The cache rule (`idempo_core::machine::cache`, `spec/STORAGE.md` §9) for the TypeScript
//! cached store: whether a cached entry may be served, and the `PX` of a fill.
use idempo_core::machine::cache;
use napi::Env;
use napi_derive::napi;

use crate::num::{from_u64, to_u64};

/// True when a cached entry (record `state` 1|2|3, `expiresAt` unix ms) may be served at the
/// cache's time `nowMs`: completed and unexpired.
#[napi(catch_unwind)]
pub fn cache_servable(env: Env, state: i32, expires_at: f64, now_ms: f64) -> napi::Result<bool> {
    let run = || {
        Ok(cache::servable(
            i64::from(state),
            to_u64(expires_at, "expiresAt")?,
            to_u64(now_ms, "nowMs")?,
        ))
    };
    run().map_err(|f: crate::error::Fail| f.throw(&env))
}

/// The `PX` of a cache fill: `min(cacheTtlMs, expiresAt − readNowMs)` (the authority's time of
/// the read) less `elapsedMs` (host monotonic time from sending the read to sending the `SET`,
/// rounded up); `null`: send no `SET`.
#[napi(catch_unwind)]
pub fn cache_fill_px(
    env: Env,
    state: i32,
    expires_at: f64,
    cache_ttl_ms: f64,
    read_now_ms: f64,
    elapsed_ms: f64,
) -> napi::Result<Option<f64>> {
    let run = || {
        Ok(cache::fill_px_ms(
            i64::from(state),
            to_u64(expires_at, "expiresAt")?,
            to_u64(cache_ttl_ms, "cacheTtlMs")?,
            to_u64(read_now_ms, "readNowMs")?,
            to_u64(elapsed_ms, "elapsedMs")?,
        )
        .map(from_u64))
    };
    run().map_err(|f: crate::error::Fail| f.throw(&env))
}
