//! The SQLite stores' wait for a setup step SQLite refuses as busy (`spec/STORAGE.md` §7).
//!
//! Switching a fresh file to WAL needs an exclusive lock, and SQLite refuses it at once, without
//! its busy handler, while another connection opens the same file. Every SQLite store (Python,
//! Node, the gateway) retries such a step with the same schedule, bounded by its
//! `busy_timeout_ms`: pauses doubling from [`FIRST_PAUSE_MS`] to [`MAX_PAUSE_MS`], the last one
//! cut to end at the bound.

/// The pause after the first refusal, ms.
pub const FIRST_PAUSE_MS: u64 = 1;
/// The longest pause between two attempts, ms.
pub const MAX_PAUSE_MS: u64 = 25;

/// The pause before the next attempt of a setup step after its `refused`-th refusal as busy
/// (1 for the first), `waited_ms` after the first attempt began; `None` once `bound_ms` is spent:
/// give up and report the store unavailable.
#[must_use]
pub fn setup_pause_ms(refused: u32, waited_ms: u64, bound_ms: u64) -> Option<u64> {
    if waited_ms >= bound_ms {
        return None;
    }
    let doubled = FIRST_PAUSE_MS
        .checked_shl(refused.saturating_sub(1))
        .unwrap_or(MAX_PAUSE_MS);
    Some(doubled.min(MAX_PAUSE_MS).min(bound_ms - waited_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_to_the_cap_and_end_at_the_bound() {
        let pauses: Vec<_> = (1..=8).map(|n| setup_pause_ms(n, 0, 5_000)).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 25, 25, 25].map(Some).to_vec());
        assert_eq!(setup_pause_ms(200, 0, 5_000), Some(MAX_PAUSE_MS));
        assert_eq!(setup_pause_ms(9, 4_990, 5_000), Some(10));
        assert_eq!(setup_pause_ms(1, 5_000, 5_000), None);
        assert_eq!(setup_pause_ms(1, 0, 0), None);
    }
}
