//! The storage primitives as pure transitions on one slot (`Option<Record>`), at the store's time.
//!
//! This is the normative reference for `spec/STORAGE.md`: each function is one atomic primitive.
//! Real adapters (PostgreSQL, SQLite, Redis, memory) implement the same semantics in their own
//! atomic step; the in-memory reference store in `tests/` and the stateright model call these
//! functions directly, so the model checks exactly what ships.
//!
//! Times saturate at `u64::MAX` instead of overflowing.
use crate::record::{
    FencingToken, FingerprintText, MAX_GENERATION, Record, RecordState, StoredResponse,
};

/// Result of [`claim`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum ClaimOutcome {
    /// The caller now owns a new in-progress record of this generation.
    Claimed {
        /// 1 for a fresh key, previous generation + 1 when an expired record was replaced.
        generation: u32,
    },
    /// A live record exists; nothing was written.
    Existing(Record),
}

/// Primitive 1, claim: insert-if-absent.
///
/// A record with `expires_at <= now` counts as absent and is replaced in the same step with
/// `generation = old + 1` (saturating at 2^31-1), else generation 1. The new record is in progress
/// with `lease_until = now + lease_ms` and `expires_at = now + max(ttl_ms, lease_ms)`.
pub fn claim(
    slot: &mut Option<Record>,
    fingerprint: &FingerprintText,
    token: FencingToken,
    lease_ms: u64,
    ttl_ms: u64,
    now_ms: u64,
) -> ClaimOutcome {
    let generation = match slot {
        Some(existing) if !existing.is_expired(now_ms) => {
            return ClaimOutcome::Existing(existing.clone());
        }
        Some(expired) => expired.generation.saturating_add(1).min(MAX_GENERATION),
        None => 1,
    };
    *slot = Some(Record {
        fingerprint: fingerprint.clone(),
        generation,
        token,
        expires_at_ms: now_ms.saturating_add(ttl_ms.max(lease_ms)),
        state: RecordState::InProgress {
            lease_until_ms: now_ms.saturating_add(lease_ms),
        },
    });
    ClaimOutcome::Claimed { generation }
}

fn owned_in_progress(slot: &mut Option<Record>, token: FencingToken) -> Option<(&mut Record, u64)> {
    match slot {
        Some(r) if r.token == token => match r.state {
            RecordState::InProgress { lease_until_ms } => Some((r, lease_until_ms)),
            _ => None,
        },
        _ => None,
    }
}

/// Primitive 3, takeover: only where state = in progress AND token = `seen` AND
/// `lease_until <= now`: token = `new`, `lease_until = now + lease_ms`,
/// `expires_at = max(expires_at, now + lease_ms)`. Returns the (unchanged) generation.
#[must_use]
pub fn takeover(
    slot: &mut Option<Record>,
    seen: FencingToken,
    new: FencingToken,
    lease_ms: u64,
    now_ms: u64,
) -> Option<u32> {
    let (r, lease_until) = owned_in_progress(slot, seen)?;
    if lease_until > now_ms {
        return None;
    }
    let until = now_ms.saturating_add(lease_ms);
    r.token = new;
    r.state = RecordState::InProgress {
        lease_until_ms: until,
    };
    r.expires_at_ms = r.expires_at_ms.max(until);
    Some(r.generation)
}

/// Primitive 4, mark_unknown: only where state = in progress AND token = `seen` AND
/// `lease_until <= now`: state = outcome unknown, lease cleared, `expires_at = now + ttl_ms`.
#[must_use]
pub fn mark_unknown(
    slot: &mut Option<Record>,
    seen: FencingToken,
    ttl_ms: u64,
    now_ms: u64,
) -> bool {
    match owned_in_progress(slot, seen) {
        Some((r, lease_until)) if lease_until <= now_ms => {
            r.state = RecordState::OutcomeUnknown;
            r.expires_at_ms = now_ms.saturating_add(ttl_ms);
            true
        }
        _ => false,
    }
}

/// Primitive 5, complete: only where state = in progress AND token = `mine` (the lease is not
/// checked: a late owner still holding the token is the only executor): state = completed,
/// response stored, lease cleared, `expires_at = now + ttl_ms`.
#[must_use]
pub fn complete(
    slot: &mut Option<Record>,
    mine: FencingToken,
    response: StoredResponse,
    ttl_ms: u64,
    now_ms: u64,
) -> bool {
    match owned_in_progress(slot, mine) {
        Some((r, _)) => {
            r.state = RecordState::Completed { response };
            r.expires_at_ms = now_ms.saturating_add(ttl_ms);
            true
        }
        None => false,
    }
}

/// Primitive 6, release: delete only where state = in progress AND token = `mine`.
#[must_use]
pub fn release(slot: &mut Option<Record>, mine: FencingToken) -> bool {
    if owned_in_progress(slot, mine).is_some() {
        *slot = None;
        true
    } else {
        false
    }
}

/// Primitive 7, renew: only where state = in progress AND token = `mine`:
/// `lease_until = now + lease_ms`, `expires_at = max(expires_at, now + lease_ms)`.
///
/// `lease_ms = 0` is valid and expires the caller's own lease at once (used by the flow to hand
/// an abandoned execution to the takeover policy).
#[must_use]
pub fn renew(slot: &mut Option<Record>, mine: FencingToken, lease_ms: u64, now_ms: u64) -> bool {
    match owned_in_progress(slot, mine) {
        Some((r, _)) => {
            let until = now_ms.saturating_add(lease_ms);
            r.state = RecordState::InProgress {
                lease_until_ms: until,
            };
            r.expires_at_ms = r.expires_at_ms.max(until);
            true
        }
        None => false,
    }
}

/// Primitive 8 helper, purge: true when the record is due for deletion (`expires_at <= now`).
#[must_use]
pub fn purgeable(record: &Record, now_ms: u64) -> bool {
    record.is_expired(now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: FencingToken = FencingToken([0xa; 16]);
    const B: FencingToken = FencingToken([0xb; 16]);

    fn fp() -> FingerprintText {
        FingerprintText::new("v1:aa").expect("valid")
    }

    fn resp() -> StoredResponse {
        StoredResponse {
            status: 200,
            headers: vec![],
            body: b"ok".to_vec(),
        }
    }

    #[test]
    fn claim_insert_and_existing() {
        let mut s = None;
        assert_eq!(
            claim(&mut s, &fp(), A, 1_000, 5_000, 100),
            ClaimOutcome::Claimed { generation: 1 }
        );
        let r = s.clone().expect("inserted");
        assert_eq!(r.expires_at_ms, 5_100);
        assert_eq!(r.lease_until_ms(), Some(1_100));
        assert_eq!(
            claim(&mut s, &fp(), B, 1_000, 5_000, 200),
            ClaimOutcome::Existing(r)
        );
    }

    #[test]
    fn claim_replaces_expired_with_next_generation_and_expiry_covers_lease() {
        let mut s = None;
        let _ = claim(&mut s, &fp(), A, 1_000, 500, 0);
        assert_eq!(s.as_ref().map(|r| r.expires_at_ms), Some(1_000));
        assert_eq!(
            claim(&mut s, &fp(), B, 1_000, 500, 1_000),
            ClaimOutcome::Claimed { generation: 2 }
        );
        assert_eq!(s.as_ref().map(|r| r.token), Some(B));
    }

    #[test]
    fn takeover_only_after_lease_expiry_and_with_seen_token() {
        let mut s = None;
        let _ = claim(&mut s, &fp(), A, 1_000, 5_000, 0);
        assert_eq!(takeover(&mut s, A, B, 1_000, 999), None);
        assert_eq!(takeover(&mut s, B, B, 1_000, 1_000), None);
        assert_eq!(takeover(&mut s, A, B, 7_000, 1_000), Some(1));
        let r = s.clone().expect("present");
        assert_eq!(
            (r.token, r.lease_until_ms(), r.expires_at_ms),
            (B, Some(8_000), 8_000)
        );
        // the stale owner can neither complete, renew nor release
        assert!(!complete(&mut s, A, resp(), 5_000, 1_500));
        assert!(!renew(&mut s, A, 1_000, 1_500));
        assert!(!release(&mut s, A));
        assert!(complete(&mut s, B, resp(), 5_000, 1_500));
        assert!(!complete(&mut s, B, resp(), 5_000, 1_600), "completed once");
    }

    #[test]
    fn mark_unknown_requires_expired_lease() {
        let mut s = None;
        let _ = claim(&mut s, &fp(), A, 1_000, 5_000, 0);
        assert!(!mark_unknown(&mut s, A, 9_000, 500));
        assert!(renew(&mut s, A, 0, 600));
        assert!(mark_unknown(&mut s, A, 9_000, 600));
        assert_eq!(
            s.as_ref().map(|r| (&r.state, r.expires_at_ms)),
            Some((&RecordState::OutcomeUnknown, 9_600))
        );
        assert!(!complete(&mut s, A, resp(), 1, 700));
    }

    #[test]
    fn release_checks_token() {
        let mut s = None;
        let _ = claim(&mut s, &fp(), A, 1_000, 5_000, 0);
        assert!(!release(&mut s, B));
        assert!(s.is_some());
        assert!(release(&mut s, A));
        assert!(s.is_none());
        assert!(!release(&mut s, A));
    }

    #[test]
    fn purge_keeps_live_records_and_takes_expired_ones() {
        let mut s = None;
        let _ = claim(&mut s, &fp(), A, 1_000, 5_000, 0);
        let in_flight = s.clone().expect("claimed");
        assert!(!purgeable(&in_flight, 4_999), "an in-flight record is live");
        assert!(purgeable(&in_flight, 5_000), "due at expires_at");
        assert!(complete(&mut s, A, resp(), 3_000, 500));
        let done = s.clone().expect("completed");
        assert!(
            !purgeable(&done, done.expires_at_ms - 1),
            "a stored answer is live"
        );
        assert!(purgeable(&done, done.expires_at_ms));
    }
}
