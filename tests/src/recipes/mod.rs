//! The shipped store recipes run in process, for comparison with core's primitives.
//!
//! `idempo_core::recipes` holds the SQL and Lua texts every binding executes; the model checks
//! core's Rust primitives (`idempo_core::machine::store`). This module closes the gap: it runs the
//! SQLite recipes on a real SQLite (rusqlite, bundled) and the Redis scripts on a real Lua 5.1
//! interpreter (mlua, vendored) whose `redis.call` implements the handful of commands the scripts
//! use over an in-memory hash, starting from any slot the model holds, and returns the result and
//! the slot after the step in core's types. [`check_step`] compares one step of every backend
//! with core's primitive on the same slot; `crate::model::recipe_check` does that on every
//! reachable state of the model.
use idempo_core::machine::StoreOp;
use idempo_core::machine::store::{self, ClaimOutcome};
use idempo_core::record::{Record, StoredResponse};

pub mod redis;
pub mod sqlite;

/// One primitive's answer, in core's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Primitive 1.
    Claim(ClaimOutcome),
    /// Primitive 2: the record as stored (expired or not).
    Get(Option<Record>),
    /// Primitive 3: the generation when applied.
    TakeOver(Option<u32>),
    /// Primitives 4 to 7: applied or not.
    Applied(bool),
    /// Primitive 8 for one record: the state code of the deleted record, when it was deleted.
    Purge(Option<i64>),
}

/// A step: one of the flow's store operations, or the purge of the slot.
#[derive(Clone, Copy, Debug)]
pub enum Step<'a> {
    /// A [`StoreOp`] the flow asked for (`Commit` is not a recipe and is never passed).
    Op(&'a StoreOp),
    /// The purge of an expired record.
    Purge,
}

/// What a step did: its answer and the slot after it.
pub type Outcome = (Applied, Option<Record>);

/// Core's primitive for `step` on a copy of `slot`: the reference.
///
/// # Errors
/// A `Commit` step (not a primitive) or a response that does not decode.
pub fn core_step(slot: &Option<Record>, step: Step<'_>, now_ms: u64) -> Result<Outcome, String> {
    let mut s = slot.clone();
    let applied = match step {
        Step::Purge => match &s {
            Some(r) if store::purgeable(r, now_ms) => {
                let code = r.state.code();
                s = None;
                Applied::Purge(Some(code))
            }
            _ => Applied::Purge(None),
        },
        Step::Op(op) => match op {
            StoreOp::Claim {
                fingerprint,
                token,
                lease_ms,
                ttl_ms,
                ..
            } => Applied::Claim(store::claim(
                &mut s,
                fingerprint,
                *token,
                *lease_ms,
                *ttl_ms,
                now_ms,
            )),
            StoreOp::Get { .. } => Applied::Get(s.clone()),
            StoreOp::TakeOver {
                seen_token,
                new_token,
                lease_ms,
                ..
            } => Applied::TakeOver(store::takeover(
                &mut s,
                *seen_token,
                *new_token,
                *lease_ms,
                now_ms,
            )),
            StoreOp::MarkUnknown {
                seen_token, ttl_ms, ..
            } => Applied::Applied(store::mark_unknown(&mut s, *seen_token, *ttl_ms, now_ms)),
            StoreOp::Complete {
                token,
                response,
                ttl_ms,
                ..
            } => {
                let decoded = StoredResponse::decode(response).map_err(|e| e.to_string())?;
                Applied::Applied(store::complete(&mut s, *token, decoded, *ttl_ms, now_ms))
            }
            StoreOp::Release { token, .. } => Applied::Applied(store::release(&mut s, *token)),
            StoreOp::Renew {
                token, lease_ms, ..
            } => Applied::Applied(store::renew(&mut s, *token, *lease_ms, now_ms)),
            StoreOp::Commit { .. } => return Err("COMMIT is not a store recipe".into()),
        },
    };
    Ok((applied, s))
}

/// Runs `step` on core and on every backend from the same `slot` and returns the first
/// disagreement, named by backend, step and slot.
pub fn check_step(
    sqlite: &mut sqlite::SqliteRecipes,
    redis: &mut redis::RedisRecipes,
    slot: &Option<Record>,
    step: Step<'_>,
    now_ms: u64,
) -> Result<(), String> {
    let want = core_step(slot, step, now_ms)?;
    let got = [
        ("sqlite", sqlite.step(slot, step, now_ms)),
        ("redis", redis.step(slot, step, now_ms)),
    ];
    for (name, outcome) in got {
        let outcome = outcome.map_err(|e| format!("{name}: {step:?} on {slot:?}: {e}"))?;
        if outcome != want {
            return Err(format!(
                "{name} disagrees with core at now={now_ms} on {step:?} from {slot:?}:\n  core:   {want:?}\n  {name}: {outcome:?}"
            ));
        }
    }
    Ok(())
}
