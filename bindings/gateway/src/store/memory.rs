//! Core's bounded in-memory store ([`idempo_core::machine::memory::MemoryStore`]) behind a lock.
use std::sync::{Arc, Mutex, MutexGuard};

use idempo_core::machine::memory::{MemoryLimits, MemoryStore, Partition, PurgeCounts, RunError};
use idempo_core::machine::{StoreOp, StoreResult};

use super::{Clock, StoreError};

/// The memory store shared by every request of one gateway process.
#[derive(Debug, Clone)]
pub struct MemStore {
    inner: Arc<Mutex<MemoryStore>>,
    clock: Clock,
}

impl MemStore {
    /// A store with these limits (`memory_store.max_entries`, `max_bytes`).
    #[must_use]
    pub fn new(max_entries: usize, max_bytes: usize, clock: Clock) -> Self {
        Self {
            inner: Arc::new(Mutex::new(MemoryStore::new(MemoryLimits::new(
                max_entries,
                max_bytes,
            )))),
            clock,
        }
    }

    fn lock(&self) -> MutexGuard<'_, MemoryStore> {
        // A panic while holding the lock cannot leave a record half-written (each transition
        // is computed before it is attached), so a poisoned lock is still usable.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs one primitive.
    ///
    /// # Errors
    /// [`StoreError::Memory`] when the store is full or the partition over its quota;
    /// [`StoreError::Corrupt`] for a response that does not decode.
    pub fn run(
        &self,
        op: StoreOp,
        partition: Option<Partition>,
    ) -> Result<StoreResult, StoreError> {
        let now = self.clock.now_ms();
        self.lock().run(&op, partition, now).map_err(|e| match e {
            RunError::Refused(e) => StoreError::Memory(e.to_string()),
            RunError::Corrupt(e) => StoreError::Corrupt(e.to_string()),
            RunError::NotAPrimitive => StoreError::Unsupported("COMMIT"),
            other => StoreError::Memory(other.to_string()),
        })
    }

    /// Deletes up to `batch` expired records.
    #[must_use]
    pub fn purge_expired(&self, batch: u64) -> PurgeCounts {
        let now = self.clock.now_ms();
        self.lock()
            .purge_expired(usize::try_from(batch).unwrap_or(usize::MAX), now)
    }

    /// Records held (tests, metrics).
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no record is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
