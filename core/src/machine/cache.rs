//! The cache rule (`spec/STORAGE.md` §9): when a cached copy of a record may answer, and how long
//! a cache fill may live. Pure functions used by the Python and Node cached stores and by the
//! model checker, so the model's cache mutations break the rule that ships.
//!
//! - [`servable`]: a cached copy answers only when it is **completed** and unexpired on the
//!   cache's clock; anything else falls through to the authority.
//! - [`answer`]: what the cached copy answers a request with, decided by
//!   [`decide`]: a replay or a mismatch is answered from the cache, anything else
//!   falls through.
//! - [`fill_px_ms`]: the `PX` of a fill, `min(cache_ttl, expires_at − now_at_read)` shrunk by the
//!   fill's own delay (from when the read was sent to when the `SET` is sent, on the host's
//!   monotonic clock), so the entry never outlives the record; `None` (send no `SET`) when
//!   nothing is left. It is [`fill_budget_ms`] (at the read) followed by [`shrink_ms`] (at the
//!   `SET`).
use super::{Decision, decide};
use crate::policy::Config;
use crate::record::{FingerprintText, Record, STATE_COMPLETED, StoredResponse};

/// What a cached copy answers (see [`answer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum CacheAnswer<'r> {
    /// Replay the cached response (same fingerprint).
    Replay(&'r StoredResponse),
    /// Answer 422: the cached record belongs to another request.
    Mismatch,
    /// The cache cannot answer: ask the authority.
    FallThrough,
}

/// True when a cached copy in state `state` (the record's state code) with this `expires_at` may
/// be served at the cache's time `cache_now_ms`: completed and `expires_at > now`. Every other
/// entry (in progress, outcome-unknown, expired, whatever the two clocks say) falls through.
#[must_use]
pub fn servable(state: i64, expires_at_ms: u64, cache_now_ms: u64) -> bool {
    state == STATE_COMPLETED && expires_at_ms > cache_now_ms
}

/// What the cached copy `cached` answers a request with fingerprint `request_fp` at the cache's
/// time `cache_now_ms`: [`decide`] on the copy when it is [`servable`]; a replay or a mismatch is
/// answered from the cache, anything else falls through.
pub fn answer<'r>(
    cached: &'r Record,
    request_fp: &FingerprintText,
    cache_now_ms: u64,
    config: &Config,
) -> CacheAnswer<'r> {
    if !servable(cached.state.code(), cached.expires_at_ms, cache_now_ms) {
        return CacheAnswer::FallThrough;
    }
    match decide(cached, request_fp, cache_now_ms, config) {
        Decision::Replay(response) => CacheAnswer::Replay(response),
        Decision::Mismatch => CacheAnswer::Mismatch,
        _ => CacheAnswer::FallThrough,
    }
}

/// Fill, at the read: the time a fill of this record may live, `min(cache_ttl_ms, expires_at −
/// read_now_ms)` with `read_now_ms` the authority's time of the read; `None` when the record is
/// not completed or nothing is left.
#[must_use]
pub fn fill_budget_ms(
    state: i64,
    expires_at_ms: u64,
    cache_ttl_ms: u64,
    read_now_ms: u64,
) -> Option<u64> {
    if state != STATE_COMPLETED {
        return None;
    }
    Some(cache_ttl_ms.min(expires_at_ms.saturating_sub(read_now_ms))).filter(|&ms| ms > 0)
}

/// Fill, at the `SET`: what is left of `budget_ms` after `elapsed_ms` (the host's monotonic time
/// from when the read was sent to when the `SET` is sent, rounded up); `None` when nothing is
/// left (send no `SET`).
#[must_use]
pub fn shrink_ms(budget_ms: u64, elapsed_ms: u64) -> Option<u64> {
    Some(budget_ms.saturating_sub(elapsed_ms)).filter(|&ms| ms > 0)
}

/// The `PX` of a cache fill (`spec/STORAGE.md` §9): [`fill_budget_ms`] shrunk by the fill's own
/// delay ([`shrink_ms`]). Never past the record's expiry; `None`: send no `SET`.
#[must_use]
pub fn fill_px_ms(
    state: i64,
    expires_at_ms: u64,
    cache_ttl_ms: u64,
    read_now_ms: u64,
    elapsed_ms: u64,
) -> Option<u64> {
    fill_budget_ms(state, expires_at_ms, cache_ttl_ms, read_now_ms)
        .and_then(|budget| shrink_ms(budget, elapsed_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{FencingToken, RecordState, STATE_IN_PROGRESS, STATE_OUTCOME_UNKNOWN};

    fn fp(s: &str) -> FingerprintText {
        FingerprintText::new(s).expect("valid")
    }

    fn completed(expires_at_ms: u64) -> Record {
        Record {
            fingerprint: fp("v1:aa"),
            generation: 1,
            token: FencingToken([0; 16]),
            expires_at_ms,
            state: RecordState::Completed {
                response: StoredResponse {
                    status: 201,
                    headers: vec![],
                    body: b"{}".to_vec(),
                },
            },
        }
    }

    #[test]
    fn only_completed_unexpired_copies_are_served() {
        assert!(servable(STATE_COMPLETED, 1_001, 1_000));
        assert!(!servable(STATE_COMPLETED, 1_000, 1_000));
        assert!(!servable(STATE_IN_PROGRESS, 5_000, 1_000));
        assert!(!servable(STATE_OUTCOME_UNKNOWN, 5_000, 1_000));
    }

    #[test]
    fn answer_replays_or_mismatches_else_falls_through() {
        let r = completed(2_000);
        let cfg = Config::default();
        assert!(matches!(
            answer(&r, &fp("v1:aa"), 1_000, &cfg),
            CacheAnswer::Replay(_)
        ));
        assert_eq!(answer(&r, &fp("v1:bb"), 1_000, &cfg), CacheAnswer::Mismatch);
        assert_eq!(
            answer(&r, &fp("v1:aa"), 2_000, &cfg),
            CacheAnswer::FallThrough
        );
    }

    #[test]
    fn fill_never_outlives_the_record() {
        assert_eq!(
            fill_px_ms(STATE_COMPLETED, 10_000, 60_000, 4_000, 0),
            Some(6_000)
        );
        assert_eq!(
            fill_px_ms(STATE_COMPLETED, 100_000, 60_000, 0, 0),
            Some(60_000)
        );
        assert_eq!(
            fill_px_ms(STATE_COMPLETED, 10_000, 60_000, 4_000, 250),
            Some(5_750)
        );
        assert_eq!(
            fill_px_ms(STATE_COMPLETED, 10_000, 60_000, 4_000, 6_000),
            None
        );
        assert_eq!(fill_px_ms(STATE_COMPLETED, 10_000, 60_000, 10_000, 0), None);
        assert_eq!(fill_px_ms(STATE_COMPLETED, 10_000, 0, 0, 0), None);
        assert_eq!(fill_px_ms(STATE_IN_PROGRESS, 10_000, 60_000, 0, 0), None);
    }

    /// A fill with nothing left is no fill (`None`, never a `PX` of 0): a record that expires
    /// at the read, or a cache TTL of 0.
    #[test]
    fn a_fill_budget_of_nothing_is_none() {
        assert_eq!(
            fill_budget_ms(STATE_COMPLETED, 10_000, 60_000, 10_000),
            None
        );
        assert_eq!(fill_budget_ms(STATE_COMPLETED, 10_000, 0, 0), None);
        assert_eq!(
            fill_budget_ms(STATE_COMPLETED, 10_001, 60_000, 10_000),
            Some(1)
        );
        assert_eq!(
            fill_budget_ms(STATE_COMPLETED, 90_000, 60_000, 10_000),
            Some(60_000)
        );
        assert_eq!(
            fill_budget_ms(STATE_OUTCOME_UNKNOWN, 90_000, 60_000, 10_000),
            None
        );
    }
}
