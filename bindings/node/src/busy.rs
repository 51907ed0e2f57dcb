//! The SQLite store's wait for a setup step refused as busy (`idempo_core::busy`,
//! `spec/STORAGE.md` §7): the schedule is core's, the sleeping TypeScript's.
use napi::Env;
use napi_derive::napi;

use crate::num::{from_u64, to_u64};

/// The pause (ms) before the next attempt after the `refused`-th busy refusal (1 for the first),
/// `waitedMs` after the first attempt began; `null` once `boundMs` is spent.
#[napi(catch_unwind)]
pub fn sqlite_setup_pause_ms(
    env: Env,
    refused: u32,
    waited_ms: f64,
    bound_ms: f64,
) -> napi::Result<Option<f64>> {
    let run = || {
        let pause = idempo_core::busy::setup_pause_ms(
            refused,
            to_u64(waited_ms.floor().max(0.0), "waitedMs")?,
            to_u64(bound_ms, "boundMs")?,
        );
        Ok(pause.map(from_u64))
    };
    run().map_err(|f: crate::error::Fail| f.throw(&env))
}
