//! Mutated copies of core's cache rule (`idempo_core::machine::cache`): each is a plausible wrong
//! implementation of one shipped function, and the model calls it instead of the shipped one
//! under its [`Variant`](super::Variant), so the properties are shown to catch a broken rule
//! (the correct variant calls core's functions themselves).
use idempo_core::machine::cache::{self, CacheAnswer};
use idempo_core::record::{Record, RecordState, STATE_COMPLETED};

/// `cache::fill_budget_ms` without the record's expiry: the fill lives the cache TTL
/// ([`Variant::CacheTtlUnbounded`](super::Variant::CacheTtlUnbounded)).
pub(super) fn fill_budget_unbounded(
    state: i64,
    _expires_at_ms: u64,
    cache_ttl_ms: u64,
    _read_now_ms: u64,
) -> Option<u64> {
    Some(cache_ttl_ms).filter(|&ms| state == STATE_COMPLETED && ms > 0)
}

/// `cache::shrink_ms` that forgets the fill's own delay
/// ([`Variant::CacheFillDelayIgnored`](super::Variant::CacheFillDelayIgnored)).
pub(super) fn shrink_ignoring_delay(budget_ms: u64, _elapsed_ms: u64) -> Option<u64> {
    Some(budget_ms).filter(|&ms| ms > 0)
}

/// `cache::answer` that replays a servable entry without `decide` (no fingerprint comparison)
/// ([`Variant::CacheSkipsDecide`](super::Variant::CacheSkipsDecide)).
pub(super) fn answer_skipping_decide(cached: &Record, cache_now_ms: u64) -> CacheAnswer<'_> {
    match &cached.state {
        RecordState::Completed { response }
            if cache::servable(STATE_COMPLETED, cached.expires_at_ms, cache_now_ms) =>
        {
            CacheAnswer::Replay(response)
        }
        _ => CacheAnswer::FallThrough,
    }
}
