//! The cache in front of the store (`spec/STORAGE.md` §9): the lookup before a flow starts and
//! the two-step fill (read the authority, later `SET … PX`), with core's cache rules.
use super::host::Who;
use super::{Cached, Fill, IdempoModel, TICK_MS, Variant, Worker, World, body_of, mutated, props};
use idempo_core::machine::cache::{self, CacheAnswer};
use idempo_core::machine::problem::{ProblemKind, problem_response};
use idempo_core::machine::{Outcome, replay_response};
use idempo_core::record::{FencingToken, Record, RecordState};

impl IdempoModel {
    /// The host looks the request up in the cache before starting a flow (`spec/STORAGE.md` §9):
    /// core's [`cache::answer`] (`decide` on the cached copy; a replay or a mismatch is answered
    /// from the cache, anything else falls through), or its mutated copy under
    /// [`Variant::CacheSkipsDecide`]. Returns true when the cache answered.
    pub(super) fn cache_answers(&self, w: &mut World, c: u8, token: u8) -> bool {
        let s = usize::from(self.scope_of(c));
        let Some(Some(entry)) = w.cache.get(s).cloned() else {
            return false;
        };
        let now_ms = Self::now_ms(w);
        let fp = &self.fingerprints[usize::from(self.fp_of(c))];
        let answer = if self.variant == Variant::CacheSkipsDecide {
            mutated::answer_skipping_decide(&entry.record, now_ms)
        } else {
            cache::answer(&entry.record, fp, now_ms, &self.config)
        };
        let (response, outcome) = match answer {
            CacheAnswer::Replay(stored) => (replay_response(stored), Outcome::Replayed),
            CacheAnswer::Mismatch => (
                problem_response(ProblemKind::Mismatch, None, None, None),
                Outcome::Mismatch,
            ),
            CacheAnswer::FallThrough => return false,
        };
        let seen = if outcome == Outcome::Replayed {
            props::check_cache_replay(w, s, &entry, body_of(&response.body), now_ms);
            props::Seen::CacheHit
        } else {
            props::Seen::CacheMismatch
        };
        w.ghost.seen |= seen.bit();
        let who = Who {
            client: c,
            token,
            epoch: 0,
            ran_handler: false,
            took_over: false,
            admission_fault: false,
            lock_waited: false,
        };
        self.deliver(w, &who, &response, outcome, Some(entry.epoch));
        true
    }

    /// Fill, step one: the host reads the completed record of scope `s` from the authority and
    /// computes the fill's budget with core's [`cache::fill_budget_ms`], `min(cache TTL,
    /// expires_at − now)` on the authority's clock (its mutated copy under
    /// [`Variant::CacheTtlUnbounded`]).
    pub(super) fn cache_read(&self, w: &mut World, s: usize) {
        let now_ms = Self::now_ms(w);
        let Some(ttl) = self.bounds.cache else { return };
        let Some(record) = w.store.get(s).cloned().flatten() else {
            return;
        };
        let cache_ms = u64::from(ttl) * TICK_MS;
        let (state, expires_at) = (record.state.code(), record.expires_at_ms);
        let budget = if self.variant == Variant::CacheTtlUnbounded {
            mutated::fill_budget_unbounded(state, expires_at, cache_ms, now_ms)
        } else {
            cache::fill_budget_ms(state, expires_at, cache_ms, now_ms)
        };
        // No budget: the write sends no `SET` (a zero budget is never written).
        let px_ms = budget.unwrap_or(0);
        let entry = Cached {
            record: Record {
                token: FencingToken([0; 16]),
                expires_at_ms: 0,
                ..record
            },
            epoch: w.ghost.epoch[s],
        };
        if let Some(slot) = w.filling.get_mut(s) {
            *slot = Some(Fill {
                entry,
                px_ms,
                read_at: w.now,
            });
        }
    }

    /// Fill, step two, any time later: `SET … PX`, with core's [`cache::shrink_ms`]: the time
    /// that passed since the read (the host's monotonic clock) is subtracted from the budget, so
    /// the entry dies no later than the record (its mutated copy under
    /// [`Variant::CacheFillDelayIgnored`]); an entry with no time left is not written.
    pub(super) fn cache_write(&self, w: &mut World, s: usize) {
        let now_ms = Self::now_ms(w);
        let Some(fill) = w.filling.get_mut(s).and_then(Option::take) else {
            return;
        };
        let elapsed_ms = u64::from(w.now.saturating_sub(fill.read_at)) * TICK_MS;
        let px = if self.variant == Variant::CacheFillDelayIgnored {
            mutated::shrink_ignoring_delay(fill.px_ms, elapsed_ms)
        } else {
            cache::shrink_ms(fill.px_ms, elapsed_ms)
        };
        let Some(px_ms) = px else { return };
        let mut entry = fill.entry;
        entry.record.expires_at_ms = now_ms.saturating_add(px_ms);
        if let Some(slot) = w.cache.get_mut(s) {
            *slot = Some(entry);
        }
    }

    /// Whether the host may start filling the cache for scope `s`: the authority holds a live,
    /// completed record that is not in the cache yet, and no fill is under way. A record written
    /// in an open transaction is not visible to the filler (it would read the version before the
    /// transaction, absent or expired since a claim opened it, so nothing to fill).
    pub(super) fn cache_fillable(&self, w: &World, s: usize) -> bool {
        let in_tx = w.workers.iter().any(|x| {
            matches!(x, Worker::Busy(b) if b.tx.is_some() && usize::from(self.scope_of(b.client)) == s)
        });
        if in_tx {
            return false;
        }
        let now_ms = Self::now_ms(w);
        let completed = w.store[s].as_ref().is_some_and(|r| {
            matches!(r.state, RecordState::Completed { .. }) && !r.is_expired(now_ms)
        });
        completed
            && w.filling[s].is_none()
            && !matches!(&w.cache[s], Some(e) if e.epoch == w.ghost.epoch[s]
                && w.store[s].as_ref().is_some_and(|r| r.generation == e.record.generation))
    }
}
