//! A reference in-memory store for the storage contract (`spec/STORAGE.md`), built on the pure
//! primitives in `idempo_core::machine::store`, with an explicit clock.
//!
//! It runs the store conformance scenarios (`spec/vectors/store/`) and drives the server flow in
//! the machine tests. It is core's memory store (`idempo_core::machine::memory`) without limits,
//! plus a manual clock and a "down" switch.
use idempo_core::machine::memory::{MemoryLimits, MemoryStore};
use idempo_core::machine::store::ClaimOutcome;
use idempo_core::machine::{Event, StoreOp, StoreResult};
use idempo_core::record::{FencingToken, FingerprintText, Record, StoredResponse};
use idempo_core::scope::ScopeId;

/// Deleted record counts per state, as `purge_expired` reports them.
pub use idempo_core::machine::memory::PurgeCounts;

/// The in-memory reference store: core's memory store without limits, with a clock.
#[derive(Clone, Debug)]
pub struct MemStore {
    inner: MemoryStore,
    now_ms: u64,
    /// When true every operation fails (the "store down" scenarios).
    pub down: bool,
}

impl Default for MemStore {
    fn default() -> Self {
        Self::new(0)
    }
}

/// A store error (only raised while [`MemStore::down`] is set or a response cannot be decoded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreDown;

const UNBOUNDED: MemoryLimits = MemoryLimits {
    max_entries: usize::MAX,
    max_bytes: usize::MAX,
    max_entries_per_partition: usize::MAX,
    max_bytes_per_partition: usize::MAX,
};

impl MemStore {
    /// An empty store whose clock reads `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self {
            inner: MemoryStore::new(UNBOUNDED),
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
        self.inner.get(scope)
    }

    /// Number of rows held, expired ones included.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    fn check(&self) -> Result<(), StoreDown> {
        if self.down { Err(StoreDown) } else { Ok(()) }
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
        let out = self
            .inner
            .claim(scope, None, fingerprint, token, lease_ms, ttl_ms, now)
            .map_err(|_| StoreDown)?;
        Ok((out, now))
    }

    /// Primitive 2 (expired records are returned as they are; core treats them as absent).
    pub fn get(&self, scope: &ScopeId) -> Result<(Option<Record>, u64), StoreDown> {
        self.check()?;
        Ok((self.inner.get(scope).cloned(), self.now_ms))
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
        Ok(self.inner.takeover(scope, seen, new, lease_ms, self.now_ms))
    }

    /// Primitive 4.
    pub fn mark_unknown(
        &mut self,
        scope: ScopeId,
        seen: FencingToken,
        ttl_ms: u64,
    ) -> Result<bool, StoreDown> {
        self.check()?;
        Ok(self.inner.mark_unknown(scope, seen, ttl_ms, self.now_ms))
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
        self.inner
            .complete(scope, token, response, ttl_ms, self.now_ms)
            .map_err(|_| StoreDown)
    }

    /// Primitive 6.
    pub fn release(&mut self, scope: ScopeId, token: FencingToken) -> Result<bool, StoreDown> {
        self.check()?;
        Ok(self.inner.release(scope, token))
    }

    /// Primitive 7.
    pub fn renew(
        &mut self,
        scope: ScopeId,
        token: FencingToken,
        lease_ms: u64,
    ) -> Result<bool, StoreDown> {
        self.check()?;
        Ok(self.inner.renew(scope, token, lease_ms, self.now_ms))
    }

    /// Primitive 8: deletes up to `batch` records with `expires_at <= now`, earliest expiry first.
    pub fn purge_expired(&mut self, batch: usize) -> Result<PurgeCounts, StoreDown> {
        self.check()?;
        Ok(self.inner.purge_expired(batch, self.now_ms))
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
