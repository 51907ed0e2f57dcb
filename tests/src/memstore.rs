//! A reference in-memory store for the storage contract (`spec/STORAGE.md`), built on the pure
//! primitives in `idempo_core::machine::store`, with an explicit clock.
//!
//! It runs the store conformance scenarios (`spec/vectors/store/`) and drives the server flow in
//! the machine tests. Not a product store: single-threaded, unbounded, no eviction.
use std::collections::BTreeMap;

use idempo_core::machine::store::{self, ClaimOutcome};
use idempo_core::machine::{Event, StoreOp, StoreResult};
use idempo_core::record::{FencingToken, FingerprintText, Record, StoredResponse};
use idempo_core::scope::ScopeId;

/// Deleted record counts per state, as `purge_expired` reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgeCounts {
    /// In-progress records deleted.
    pub in_progress: u64,
    /// Completed records deleted.
    pub completed: u64,
    /// Outcome-unknown records deleted.
    pub outcome_unknown: u64,
}

impl PurgeCounts {
    /// Sum of all states.
    pub fn total(&self) -> u64 {
        self.in_progress + self.completed + self.outcome_unknown
    }
}

/// The in-memory reference store.
#[derive(Clone, Debug, Default)]
pub struct MemStore {
    records: BTreeMap<ScopeId, Record>,
    now_ms: u64,
    /// When true every operation fails (the "store down" scenarios).
    pub down: bool,
}

/// A store error (only raised while [`MemStore::down`] is set or a response cannot be decoded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreDown;

impl MemStore {
    /// An empty store whose clock reads `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self {
            records: BTreeMap::new(),
            now_ms,
            down: false,
        }
    }

    /// The store's clock.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Moves the clock forward.
    pub fn advance(&mut self, ms: u64) {
        self.now_ms = self.now_ms.saturating_add(ms);
    }

    /// The raw record, expired or not (for assertions).
    pub fn peek(&self, scope: &ScopeId) -> Option<&Record> {
        self.records.get(scope)
    }

    /// Number of rows held, expired ones included.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn check(&self) -> Result<(), StoreDown> {
        if self.down { Err(StoreDown) } else { Ok(()) }
    }

    fn with_slot<T>(&mut self, scope: ScopeId, f: impl FnOnce(&mut Option<Record>) -> T) -> T {
        let mut slot = self.records.remove(&scope);
        let out = f(&mut slot);
        if let Some(r) = slot {
            self.records.insert(scope, r);
        }
        out
    }

    /// Primitive 1.
    pub fn claim(
        &mut self,
        scope: ScopeId,
        fingerprint: &FingerprintText,
        token: FencingToken,
        lease_ms: u64,
        ttl_ms: u64,
    ) -> Result<(ClaimOutcome, u64), StoreDown> {
        self.check()?;
        let now = self.now_ms;
        let out = self.with_slot(scope, |s| {
            store::claim(s, fingerprint, token, lease_ms, ttl_ms, now)
        });
        Ok((out, now))
    }

    /// Primitive 2 (expired records are returned as they are; core treats them as absent).
    pub fn get(&self, scope: &ScopeId) -> Result<(Option<Record>, u64), StoreDown> {
        self.check()?;
        Ok((self.records.get(scope).cloned(), self.now_ms))
    }

    /// Primitive 3.
    pub fn takeover(
        &mut self,
        scope: ScopeId,
        seen: FencingToken,
        new: FencingToken,
        lease_ms: u64,
    ) -> Result<Option<u32>, StoreDown> {
        self.check()?;
        let now = self.now_ms;
        Ok(self.with_slot(scope, |s| store::takeover(s, seen, new, lease_ms, now)))
    }

    /// Primitive 4.
    pub fn mark_unknown(
        &mut self,
        scope: ScopeId,
        seen: FencingToken,
        ttl_ms: u64,
    ) -> Result<bool, StoreDown> {
        self.check()?;
        let now = self.now_ms;
        Ok(self.with_slot(scope, |s| store::mark_unknown(s, seen, ttl_ms, now)))
    }

    /// Primitive 5.
    pub fn complete(
        &mut self,
        scope: ScopeId,
        token: FencingToken,
        response: StoredResponse,
        ttl_ms: u64,
    ) -> Result<bool, StoreDown> {
        self.check()?;
        let now = self.now_ms;
        Ok(self.with_slot(scope, |s| store::complete(s, token, response, ttl_ms, now)))
    }

    /// Primitive 6.
    pub fn release(&mut self, scope: ScopeId, token: FencingToken) -> Result<bool, StoreDown> {
        self.check()?;
        Ok(self.with_slot(scope, |s| store::release(s, token)))
    }

    /// Primitive 7.
    pub fn renew(
        &mut self,
        scope: ScopeId,
        token: FencingToken,
        lease_ms: u64,
    ) -> Result<bool, StoreDown> {
        self.check()?;
        let now = self.now_ms;
        Ok(self.with_slot(scope, |s| store::renew(s, token, lease_ms, now)))
    }

    /// Primitive 8: deletes up to `batch` records with `expires_at <= now`, earliest expiry first.
    pub fn purge_expired(&mut self, batch: usize) -> Result<PurgeCounts, StoreDown> {
        self.check()?;
        let now = self.now_ms;
        let mut due: Vec<(u64, ScopeId)> = self
            .records
            .iter()
            .filter(|(_, r)| store::purgeable(r, now))
            .map(|(k, r)| (r.expires_at_ms, *k))
            .collect();
        due.sort();
        let mut counts = PurgeCounts::default();
        for (_, k) in due.into_iter().take(batch) {
            if let Some(r) = self.records.remove(&k) {
                match r.state.code() {
                    1 => counts.in_progress += 1,
                    2 => counts.completed += 1,
                    _ => counts.outcome_unknown += 1,
                }
            }
        }
        Ok(counts)
    }

    /// Executes a flow's [`StoreOp`] and returns the event to feed back (`StoreFailed` when down
    /// or when the encoded response does not decode).
    pub fn execute(&mut self, op: StoreOp) -> Event {
        let result = match op {
            StoreOp::Claim {
                scope,
                fingerprint,
                token,
                lease_ms,
                ttl_ms,
            } => self
                .claim(scope, &fingerprint, token, lease_ms, ttl_ms)
                .map(|(out, now_ms)| match out {
                    ClaimOutcome::Claimed { generation } => {
                        StoreResult::Claimed { generation, now_ms }
                    }
                    ClaimOutcome::Existing(record) => StoreResult::Existing { record, now_ms },
                }),
            StoreOp::Get { scope } => self
                .get(&scope)
                .map(|(record, now_ms)| StoreResult::Got { record, now_ms }),
            StoreOp::TakeOver {
                scope,
                seen_token,
                new_token,
                lease_ms,
            } => self
                .takeover(scope, seen_token, new_token, lease_ms)
                .map(StoreResult::TookOver),
            StoreOp::MarkUnknown {
                scope,
                seen_token,
                ttl_ms,
            } => self
                .mark_unknown(scope, seen_token, ttl_ms)
                .map(StoreResult::MarkedUnknown),
            StoreOp::Complete {
                scope,
                token,
                response,
                ttl_ms,
            } => match StoredResponse::decode(&response) {
                Ok(decoded) => self
                    .complete(scope, token, decoded, ttl_ms)
                    .map(StoreResult::Completed),
                Err(_) => Err(StoreDown),
            },
            StoreOp::Release { scope, token } => {
                self.release(scope, token).map(StoreResult::Released)
            }
            StoreOp::Renew {
                scope,
                token,
                lease_ms,
            } => self.renew(scope, token, lease_ms).map(StoreResult::Renewed),
            // Every primitive here is its own atomic step: nothing is left to commit.
            StoreOp::Commit { .. } => self.check().map(|()| StoreResult::Committed),
        };
        match result {
            Ok(r) => Event::Store(r),
            Err(StoreDown) => Event::StoreFailed,
        }
    }
}
