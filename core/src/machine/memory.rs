//! The bounded in-memory store (`spec/STORAGE.md` §8): core's storage primitives
//! ([`super::store`]) applied to a map, with capacity, eviction and per-partition quotas written
//! once here and wrapped by every binding (Python's `MemoryStore`, Node's `MemoryStore`) and by
//! the Rust test suite's reference store.
//!
//! It is for tests, demos and services of **one process**: nothing survives the process and two
//! processes never see each other's records.
//!
//! # What a full store does
//!
//! The store never evicts an unexpired record (in progress, completed or outcome-unknown) to make
//! room for another key: doing so would let any client flush a victim's completed record with
//! fresh keys, and the victim's retry would run the handler again. Only expired records are
//! removed to make room. A write that still does not fit is refused with a typed
//! [`MemoryError`] (the hosts raise their `StoreUnavailable` error, so the flow answers 503 with
//! `Retry-After` and the handler never runs):
//!
//! - [`MemoryError::Full`]: the store holds `max_entries` records, or `max_bytes` bytes, of
//!   unexpired records;
//! - [`MemoryError::QuotaExceeded`]: the claim's partition holds its own quota
//!   (`max_entries_per_partition` / `max_bytes_per_partition`), so one principal cannot fill the
//!   store for everyone. The partition is an opaque 8-byte tag the host derives from the
//!   request's principal with [`Partition::of_principal`]; a claim without a partition (direct
//!   use of the store, the conformance scenarios) is held only to the global limits.
//!
//! The store is pure: no clock (every call takes `now_ms`, the store's time), no randomness, and
//! its maps are ordered (`BTreeMap` by scope id, which is already a SHA-256 digest), so the same
//! calls always give the same results.
use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::io::{StoreOp, StoreResult};
use super::store::{self as prim, ClaimOutcome};
use crate::record::{
    DecodeError, FencingToken, FingerprintText, Record, RecordState, StoredResponse,
};
use crate::scope::ScopeId;

/// Bytes counted for every record on top of its fingerprint and stored response (the map's and
/// indexes' own memory, roughly).
pub const RECORD_OVERHEAD_BYTES: usize = 160;

/// Default `max_entries`.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;

/// Default `max_bytes` (64 MiB).
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;

/// The default per-partition quota is this fraction of the global limits: `1 / 10`
/// (at least one record, at least one record's worth of bytes).
pub const DEFAULT_PARTITION_SHARE: usize = 10;

/// The tag of the partition derivation: `SHA-256(tag || principal)`, first 8 bytes.
pub const PARTITION_TAG: &str = "idempo-partition-v1:";

/// An opaque quota tag: the first 8 bytes of `SHA-256("idempo-partition-v1:" || principal)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Partition(pub [u8; 8]);

impl Partition {
    /// The partition of a principal (the same principal string the host hands to
    /// [`ScopeId::new`]; `""` for none).
    #[must_use]
    pub fn of_principal(principal: &str) -> Self {
        let mut h = Sha256::new();
        h.update(PARTITION_TAG.as_bytes());
        h.update(principal.as_bytes());
        let digest: [u8; 32] = h.finalize().into();
        let mut out = [0; 8];
        out.copy_from_slice(&digest[..8]);
        Partition(out)
    }

    /// The 8 bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; 8] {
        &self.0
    }
}

/// The capacity of a [`MemoryStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemoryLimits {
    /// Most records held (expired ones included until removed).
    pub max_entries: usize,
    /// Most bytes held, counted as [`record_bytes`].
    pub max_bytes: usize,
    /// Most records one partition holds.
    pub max_entries_per_partition: usize,
    /// Most bytes one partition holds.
    pub max_bytes_per_partition: usize,
}

impl MemoryLimits {
    /// Limits of `max_entries` and `max_bytes`, each partition held to
    /// [`DEFAULT_PARTITION_SHARE`]'s fraction of them.
    #[must_use]
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            max_entries,
            max_bytes,
            max_entries_per_partition: default_partition_share(max_entries),
            max_bytes_per_partition: default_partition_share(max_bytes),
        }
    }
}

impl Default for MemoryLimits {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES)
    }
}

/// The default quota for a global limit: `limit / DEFAULT_PARTITION_SHARE`, at least 1.
#[must_use]
pub fn default_partition_share(limit: usize) -> usize {
    (limit / DEFAULT_PARTITION_SHARE).max(1)
}

/// Why the memory store refused a write (nothing was written).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
#[must_use]
pub enum MemoryError {
    /// The store is full of unexpired records (entries or bytes); none may be evicted.
    #[error("the memory store is full of unexpired records (retry after {retry_after_ms} ms)")]
    Full {
        /// Time until the earliest unexpired record expires (≥ 1): room may be free by then
        /// (sooner, when an in-progress record is released).
        retry_after_ms: u64,
    },
    /// The claim's partition holds its quota of unexpired records (entries or bytes).
    #[error("this principal's share of the memory store is full (retry after {retry_after_ms} ms)")]
    QuotaExceeded {
        /// Time until the partition's earliest unexpired record expires (≥ 1).
        retry_after_ms: u64,
    },
}

/// Why [`MemoryStore::run`] did not execute a store operation.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RunError {
    /// The store or the claim's partition is full; nothing changed.
    #[error(transparent)]
    Refused(#[from] MemoryError),
    /// The completion's response does not decode (a host bug: the flow encodes it).
    #[error("the response to store does not decode: {0}")]
    Corrupt(DecodeError),
    /// `Commit`: transactional mode's commit is not a primitive of a memory store.
    #[error("COMMIT is not a memory store primitive (transactional mode needs a database)")]
    NotAPrimitive,
}

impl MemoryError {
    /// The hint carried by the refusal, ms.
    #[must_use]
    pub fn retry_after_ms(&self) -> u64 {
        match *self {
            Self::Full { retry_after_ms } | Self::QuotaExceeded { retry_after_ms } => {
                retry_after_ms
            }
        }
    }

    /// Stable name: `"full"` or `"quota_exceeded"`.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Full { .. } => "full",
            Self::QuotaExceeded { .. } => "quota_exceeded",
        }
    }
}

/// Records deleted by one [`MemoryStore::purge_expired`], per state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PurgeCounts {
    /// In-progress records deleted.
    pub in_progress: u64,
    /// Completed records deleted.
    pub completed: u64,
    /// Outcome-unknown records deleted.
    pub outcome_unknown: u64,
}

impl PurgeCounts {
    /// All records deleted.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.in_progress + self.completed + self.outcome_unknown
    }
}

/// Bytes a record counts for: [`RECORD_OVERHEAD_BYTES`] + fingerprint + stored response (body,
/// header names and values).
#[must_use]
pub fn record_bytes(record: &Record) -> usize {
    RECORD_OVERHEAD_BYTES
        + record.fingerprint.as_str().len()
        + match &record.state {
            RecordState::Completed { response } => response_bytes(response),
            _ => 0,
        }
}

fn response_bytes(r: &StoredResponse) -> usize {
    r.body.len()
        + r.headers
            .iter()
            .map(|(n, v)| n.len() + v.len())
            .sum::<usize>()
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    record: Record,
    partition: Option<Partition>,
    bytes: usize,
}

/// What one partition holds (the unpartitioned records are under `None`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Usage {
    entries: usize,
    bytes: usize,
    by_expiry: BTreeSet<(u64, ScopeId)>,
}

/// The bounded in-memory store (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryStore {
    limits: MemoryLimits,
    records: BTreeMap<ScopeId, Entry>,
    /// Every record's (expiry, scope), earliest first.
    by_expiry: BTreeSet<(u64, ScopeId)>,
    usage: BTreeMap<Option<Partition>, Usage>,
    bytes: usize,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(MemoryLimits::default())
    }
}

/// A write's demand on the limits.
#[derive(Clone, Copy)]
struct Demand {
    entries: usize,
    bytes: usize,
    partition: Option<Partition>,
}

impl MemoryStore {
    /// An empty store with these limits.
    #[must_use]
    pub fn new(limits: MemoryLimits) -> Self {
        Self {
            limits,
            records: BTreeMap::new(),
            by_expiry: BTreeSet::new(),
            usage: BTreeMap::new(),
            bytes: 0,
        }
    }

    /// The limits.
    #[must_use]
    pub fn limits(&self) -> MemoryLimits {
        self.limits
    }

    /// Records held (expired ones included until removed).
    #[must_use]
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when no record is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes held, counted as [`record_bytes`].
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Records held by a partition (`None`: the unpartitioned ones).
    #[must_use]
    pub fn partition_len(&self, partition: Option<Partition>) -> usize {
        self.usage.get(&partition).map_or(0, |u| u.entries)
    }

    /// Primitive 2, get: the record as stored (an expired one included: core treats it as
    /// absent).
    #[must_use]
    pub fn get(&self, scope: &ScopeId) -> Option<&Record> {
        self.records.get(scope).map(|e| &e.record)
    }

    fn detach(&mut self, scope: &ScopeId) -> Option<Entry> {
        let e = self.records.remove(scope)?;
        self.unindex((e.record.expires_at_ms, *scope), e.bytes, e.partition);
        Some(e)
    }

    /// Takes a removed record's expiry and bytes out of the indexes and counters.
    fn unindex(&mut self, at: (u64, ScopeId), bytes: usize, partition: Option<Partition>) {
        self.by_expiry.remove(&at);
        self.bytes -= bytes;
        if let Some(u) = self.usage.get_mut(&partition) {
            u.entries -= 1;
            u.bytes -= bytes;
            u.by_expiry.remove(&at);
            if u.entries == 0 {
                self.usage.remove(&partition);
            }
        }
    }

    fn attach(&mut self, scope: ScopeId, record: Record, partition: Option<Partition>) {
        let bytes = record_bytes(&record);
        let at = (record.expires_at_ms, scope);
        self.by_expiry.insert(at);
        self.bytes += bytes;
        let u = self.usage.entry(partition).or_default();
        u.entries += 1;
        u.bytes += bytes;
        u.by_expiry.insert(at);
        self.records.insert(
            scope,
            Entry {
                record,
                partition,
                bytes,
            },
        );
    }

    /// Runs `f` on the slot of `scope`, keeping the indexes right. A record that stays is
    /// changed where it is in the map (one lookup; only a changed expiry moves in the expiry
    /// indexes); a new one is attached to `partition`, a deleted one detached.
    fn with_slot<T>(
        &mut self,
        scope: ScopeId,
        partition: Option<Partition>,
        f: impl FnOnce(&mut Option<Record>) -> T,
    ) -> T {
        let Some(e) = self.records.get_mut(&scope) else {
            let mut slot = None;
            let out = f(&mut slot);
            if let Some(r) = slot {
                self.attach(scope, r, partition);
            }
            return out;
        };
        let old_at = (e.record.expires_at_ms, scope);
        let mut slot = Some(std::mem::replace(&mut e.record, Record::vacant()));
        let out = f(&mut slot);
        let Some(record) = slot else {
            let (bytes, part) = (e.bytes, e.partition);
            self.records.remove(&scope);
            self.unindex(old_at, bytes, part);
            return out;
        };
        let (old_bytes, bytes) = (e.bytes, record_bytes(&record));
        let at = (record.expires_at_ms, scope);
        e.record = record;
        e.bytes = bytes;
        self.bytes = self.bytes - old_bytes + bytes;
        if at != old_at {
            self.by_expiry.remove(&old_at);
            self.by_expiry.insert(at);
        }
        if let Some(u) = self.usage.get_mut(&e.partition) {
            u.bytes = u.bytes - old_bytes + bytes;
            if at != old_at {
                u.by_expiry.remove(&old_at);
                u.by_expiry.insert(at);
            }
        }
        out
    }

    /// The refusal, if `demand` does not fit beside what is held now.
    fn refusal(&self, d: Demand, now_ms: u64) -> Option<MemoryError> {
        let wait = |set: &BTreeSet<(u64, ScopeId)>| {
            set.iter()
                .find(|(e, _)| *e > now_ms)
                .map_or(1, |(e, _)| (e - now_ms).max(1))
        };
        if self.records.len() + d.entries > self.limits.max_entries
            || self.bytes + d.bytes > self.limits.max_bytes
        {
            return Some(MemoryError::Full {
                retry_after_ms: wait(&self.by_expiry),
            });
        }
        if d.partition.is_some() {
            let u = self.usage.get(&d.partition);
            let (entries, bytes) = u.map_or((0, 0), |u| (u.entries, u.bytes));
            if entries + d.entries > self.limits.max_entries_per_partition
                || bytes + d.bytes > self.limits.max_bytes_per_partition
            {
                return Some(MemoryError::QuotaExceeded {
                    retry_after_ms: u.map_or(1, |u| wait(&u.by_expiry)),
                });
            }
        }
        None
    }

    /// Makes room for `demand`: removes expired records (never `except`, never an unexpired
    /// one) while it does not fit, earliest expiry first.
    fn make_room(&mut self, d: Demand, except: ScopeId, now_ms: u64) -> Result<(), MemoryError> {
        if self.refusal(d, now_ms).is_none() {
            return Ok(());
        }
        let expired: Vec<ScopeId> = self
            .by_expiry
            .iter()
            .take_while(|(e, _)| *e <= now_ms)
            .map(|(_, k)| *k)
            .filter(|k| *k != except)
            .collect();
        for k in expired {
            self.detach(&k);
            if self.refusal(d, now_ms).is_none() {
                return Ok(());
            }
        }
        self.refusal(d, now_ms).map_or(Ok(()), Err)
    }

    /// Primitive 1, claim, for a request of `partition` ([`Partition::of_principal`]; `None`:
    /// held to the global limits only).
    ///
    /// A live record answers [`ClaimOutcome::Existing`] whatever the limits. A new record (or
    /// one replacing an expired record of the same scope) must fit: expired records of other
    /// scopes are removed to make room, and if it still does not fit the claim is refused and
    /// nothing is written.
    #[allow(clippy::too_many_arguments)]
    pub fn claim(
        &mut self,
        scope: ScopeId,
        partition: Option<Partition>,
        fingerprint: &FingerprintText,
        token: FencingToken,
        lease_ms: u64,
        ttl_ms: u64,
        now_ms: u64,
    ) -> Result<ClaimOutcome, MemoryError> {
        let old = match self.records.get(&scope) {
            Some(e) if !e.record.is_expired(now_ms) => {
                return Ok(ClaimOutcome::Existing(e.record.clone()));
            }
            // An expired record of this scope is replaced.
            Some(_) => self.detach(&scope),
            None => None,
        };
        let demand = Demand {
            entries: 1,
            bytes: RECORD_OVERHEAD_BYTES + fingerprint.as_str().len(),
            partition,
        };
        if let Err(refused) = self.make_room(demand, scope, now_ms) {
            if let Some(e) = old {
                self.attach(scope, e.record, e.partition);
            }
            return Err(refused);
        }
        let mut slot = old.map(|e| e.record);
        let out = prim::claim(&mut slot, fingerprint, token, lease_ms, ttl_ms, now_ms);
        if let Some(r) = slot {
            self.attach(scope, r, partition);
        }
        Ok(out)
    }

    /// Primitive 3, takeover.
    #[must_use]
    pub fn takeover(
        &mut self,
        scope: ScopeId,
        seen: FencingToken,
        new: FencingToken,
        lease_ms: u64,
        now_ms: u64,
    ) -> Option<u32> {
        if !self.records.contains_key(&scope) {
            return None;
        }
        self.with_slot(scope, None, |s| {
            prim::takeover(s, seen, new, lease_ms, now_ms)
        })
    }

    /// Primitive 4, mark_unknown.
    #[must_use]
    pub fn mark_unknown(
        &mut self,
        scope: ScopeId,
        seen: FencingToken,
        ttl_ms: u64,
        now_ms: u64,
    ) -> bool {
        if !self.records.contains_key(&scope) {
            return false;
        }
        self.with_slot(scope, None, |s| prim::mark_unknown(s, seen, ttl_ms, now_ms))
    }

    /// Primitive 5, complete. The stored response must fit (globally and in the record's
    /// partition) once expired records of other scopes are removed; else the completion is
    /// refused, nothing is written and the record stays in progress.
    pub fn complete(
        &mut self,
        scope: ScopeId,
        mine: FencingToken,
        response: StoredResponse,
        ttl_ms: u64,
        now_ms: u64,
    ) -> Result<bool, MemoryError> {
        let Some(e) = self.records.get(&scope) else {
            return Ok(false);
        };
        let owned =
            e.record.token == mine && matches!(e.record.state, RecordState::InProgress { .. });
        if !owned {
            return Ok(false);
        }
        let demand = Demand {
            entries: 0,
            bytes: response_bytes(&response),
            partition: e.partition,
        };
        self.make_room(demand, scope, now_ms)?;
        Ok(self.with_slot(scope, None, |s| {
            prim::complete(s, mine, response, ttl_ms, now_ms)
        }))
    }

    /// Primitive 6, release.
    #[must_use]
    pub fn release(&mut self, scope: ScopeId, mine: FencingToken) -> bool {
        if !self.records.contains_key(&scope) {
            return false;
        }
        self.with_slot(scope, None, |s| prim::release(s, mine))
    }

    /// Primitive 7, renew.
    #[must_use]
    pub fn renew(
        &mut self,
        scope: ScopeId,
        mine: FencingToken,
        lease_ms: u64,
        now_ms: u64,
    ) -> bool {
        if !self.records.contains_key(&scope) {
            return false;
        }
        self.with_slot(scope, None, |s| prim::renew(s, mine, lease_ms, now_ms))
    }

    /// Runs one of the flow's store operations at `now_ms` and gives the result to feed back
    /// into the flow: the translation every host of a memory store needs, written once (a claim
    /// is held to `partition`'s quota; a completion's response is decoded first).
    ///
    /// # Errors
    /// [`RunError::Refused`] when the store or the partition is full (nothing changed),
    /// [`RunError::Corrupt`] for a completion whose response does not decode,
    /// [`RunError::NotAPrimitive`] for `Commit` (transactional mode has no memory store).
    pub fn run(
        &mut self,
        op: &StoreOp,
        partition: Option<Partition>,
        now_ms: u64,
    ) -> Result<StoreResult, RunError> {
        Ok(match op {
            StoreOp::Claim {
                scope,
                fingerprint,
                token,
                lease_ms,
                ttl_ms,
            } => match self.claim(
                *scope,
                partition,
                fingerprint,
                *token,
                *lease_ms,
                *ttl_ms,
                now_ms,
            )? {
                ClaimOutcome::Claimed { generation } => StoreResult::Claimed { generation, now_ms },
                ClaimOutcome::Existing(record) => StoreResult::Existing { record, now_ms },
            },
            StoreOp::Get { scope } => StoreResult::Got {
                record: self.get(scope).cloned(),
                now_ms,
            },
            StoreOp::TakeOver {
                scope,
                seen_token,
                new_token,
                lease_ms,
            } => StoreResult::TookOver(self.takeover(
                *scope,
                *seen_token,
                *new_token,
                *lease_ms,
                now_ms,
            )),
            StoreOp::MarkUnknown {
                scope,
                seen_token,
                ttl_ms,
            } => {
                StoreResult::MarkedUnknown(self.mark_unknown(*scope, *seen_token, *ttl_ms, now_ms))
            }
            StoreOp::Complete {
                scope,
                token,
                response,
                ttl_ms,
            } => {
                let response = StoredResponse::decode(response).map_err(RunError::Corrupt)?;
                StoreResult::Completed(self.complete(*scope, *token, response, *ttl_ms, now_ms)?)
            }
            StoreOp::Release { scope, token } => {
                StoreResult::Released(self.release(*scope, *token))
            }
            StoreOp::Renew {
                scope,
                token,
                lease_ms,
            } => StoreResult::Renewed(self.renew(*scope, *token, *lease_ms, now_ms)),
            StoreOp::Commit { .. } => return Err(RunError::NotAPrimitive),
        })
    }

    /// Primitive 8, purge: deletes at most `batch` records with `expires_at <= now`, earliest
    /// expiry first, and counts them per state.
    pub fn purge_expired(&mut self, batch: usize, now_ms: u64) -> PurgeCounts {
        let due: Vec<ScopeId> = self
            .by_expiry
            .iter()
            .take_while(|(e, _)| *e <= now_ms)
            .take(batch)
            .map(|(_, k)| *k)
            .collect();
        let mut counts = PurgeCounts::default();
        for k in due {
            if let Some(e) = self.detach(&k) {
                debug_assert!(prim::purgeable(&e.record, now_ms));
                match e.record.state {
                    RecordState::InProgress { .. } => counts.in_progress += 1,
                    RecordState::Completed { .. } => counts.completed += 1,
                    RecordState::OutcomeUnknown => counts.outcome_unknown += 1,
                }
            }
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: FencingToken = FencingToken([0xa; 16]);

    fn fp() -> FingerprintText {
        FingerprintText::new("v1:aa").expect("valid")
    }

    fn scope(i: u32) -> ScopeId {
        ScopeId::from_parts("p", "POST", "/r", &i.to_string())
    }

    fn resp() -> StoredResponse {
        StoredResponse {
            status: 200,
            headers: vec![],
            body: b"ok".to_vec(),
        }
    }

    #[test]
    fn run_translates_each_operation_and_reports_refusals() {
        let mut m = MemoryStore::new(limits(1, 1));
        let s = scope(1);
        let claim = StoreOp::Claim {
            scope: s,
            fingerprint: fp(),
            token: A,
            lease_ms: 10,
            ttl_ms: 100,
        };
        assert_eq!(
            m.run(&claim, None, 1_000),
            Ok(StoreResult::Claimed {
                generation: 1,
                now_ms: 1_000
            })
        );
        let renew = StoreOp::Renew {
            scope: s,
            token: A,
            lease_ms: 20,
        };
        assert_eq!(m.run(&renew, None, 1_001), Ok(StoreResult::Renewed(true)));
        let other = StoreOp::Claim {
            scope: scope(2),
            fingerprint: fp(),
            token: A,
            lease_ms: 10,
            ttl_ms: 100,
        };
        assert!(matches!(
            m.run(&other, None, 1_002),
            Err(RunError::Refused(MemoryError::Full { .. }))
        ));
        let garbled = StoreOp::Complete {
            scope: s,
            token: A,
            response: vec![0xff],
            ttl_ms: 100,
        };
        assert!(matches!(
            m.run(&garbled, None, 1_003),
            Err(RunError::Corrupt(_))
        ));
        let complete = StoreOp::Complete {
            scope: s,
            token: A,
            response: resp().encode().expect("encodes"),
            ttl_ms: 100,
        };
        assert_eq!(
            m.run(&complete, None, 1_004),
            Ok(StoreResult::Completed(true))
        );
        let Ok(StoreResult::Got {
            record: Some(r),
            now_ms: 1_005,
        }) = m.run(&StoreOp::Get { scope: s }, None, 1_005)
        else {
            panic!("the completed record")
        };
        assert_eq!(r.state, RecordState::Completed { response: resp() });
        assert_eq!(
            m.run(&StoreOp::Release { scope: s, token: A }, None, 1_006),
            Ok(StoreResult::Released(false))
        );
        assert_eq!(
            m.run(&StoreOp::Commit { scope: s }, None, 1_007),
            Err(RunError::NotAPrimitive)
        );
    }

    fn limits(entries: usize, per: usize) -> MemoryLimits {
        MemoryLimits {
            max_entries: entries,
            max_bytes: usize::MAX,
            max_entries_per_partition: per,
            max_bytes_per_partition: usize::MAX,
        }
    }

    #[test]
    fn partition_of_principal_is_stable_and_distinct() {
        assert_eq!(
            Partition::of_principal("alice"),
            Partition::of_principal("alice")
        );
        assert_ne!(
            Partition::of_principal("alice"),
            Partition::of_principal("bob")
        );
        assert_ne!(
            Partition::of_principal(""),
            Partition::of_principal("alice")
        );
    }

    #[test]
    fn full_store_never_evicts_a_live_completed_record() {
        let mut m = MemoryStore::new(limits(2, 2));
        let victim = Some(Partition::of_principal("victim"));
        let _ = m.claim(scope(0), victim, &fp(), A, 1_000, 10_000, 0);
        assert_eq!(m.complete(scope(0), A, resp(), 10_000, 10), Ok(true));
        let attacker = Some(Partition::of_principal("attacker"));
        assert!(
            m.claim(scope(1), attacker, &fp(), A, 1_000, 10_000, 20)
                .is_ok()
        );
        let refused = m.claim(scope(2), attacker, &fp(), A, 1_000, 10_000, 30);
        assert_eq!(
            refused,
            Err(MemoryError::Full {
                retry_after_ms: 9_980
            })
        );
        assert!(matches!(
            m.get(&scope(0)).map(|r| &r.state),
            Some(RecordState::Completed { .. })
        ));
        // Once the victim's record expired, its room is reused.
        assert!(
            m.claim(scope(2), attacker, &fp(), A, 1_000, 10_000, 10_010)
                .is_ok()
        );
        assert!(m.get(&scope(0)).is_none());
    }

    #[test]
    fn quota_refuses_one_partition_only() {
        let mut m = MemoryStore::new(limits(10, 1));
        let a = Some(Partition::of_principal("a"));
        let b = Some(Partition::of_principal("b"));
        assert!(m.claim(scope(0), a, &fp(), A, 1_000, 5_000, 0).is_ok());
        assert_eq!(
            m.claim(scope(1), a, &fp(), A, 1_000, 5_000, 100),
            Err(MemoryError::QuotaExceeded {
                retry_after_ms: 4_900
            })
        );
        assert!(m.claim(scope(1), b, &fp(), A, 1_000, 5_000, 100).is_ok());
        // Unpartitioned claims are held to the global limits only.
        assert!(m.claim(scope(2), None, &fp(), A, 1_000, 5_000, 100).is_ok());
        assert!(m.claim(scope(3), None, &fp(), A, 1_000, 5_000, 100).is_ok());
        assert_eq!(m.partition_len(None), 2);
    }

    #[test]
    fn refused_claim_keeps_the_expired_record_of_its_own_scope() {
        let mut m = MemoryStore::new(limits(1, 1));
        let _ = m.claim(scope(0), None, &fp(), A, 1_000, 1_000, 0);
        assert!(!m.release(scope(0), FencingToken([1; 16])));
        // The record of scope 0 expired: a new claim replaces it with generation 2.
        assert_eq!(
            m.claim(scope(0), None, &fp(), A, 1_000, 1_000, 5_000),
            Ok(ClaimOutcome::Claimed { generation: 2 })
        );
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn bytes_are_accounted_and_released() {
        let mut m = MemoryStore::new(MemoryLimits::new(10, 10_000));
        let _ = m.claim(scope(0), None, &fp(), A, 1_000, 5_000, 0);
        assert_eq!(m.bytes(), RECORD_OVERHEAD_BYTES + 5);
        assert_eq!(m.complete(scope(0), A, resp(), 5_000, 1), Ok(true));
        assert_eq!(m.bytes(), RECORD_OVERHEAD_BYTES + 7);
        let counts = m.purge_expired(10, 5_001);
        assert_eq!(counts.completed, 1);
        assert_eq!((m.bytes(), m.len(), m.partition_len(None)), (0, 0, 0));
    }

    /// A partition is the first 8 bytes of `SHA-256(tag || principal)` (spec/STORAGE.md), and
    /// each holds a tenth of a global limit, at least one.
    #[test]
    fn partitions_and_their_default_share() {
        let mut h = Sha256::new();
        h.update(b"idempo-partition-v1:alice");
        let digest: [u8; 32] = h.finalize().into();
        let alice = Partition::of_principal("alice");
        assert_eq!(alice.as_bytes()[..], digest[..8]);
        assert_ne!(alice.as_bytes(), Partition::of_principal("bob").as_bytes());
        assert_eq!(default_partition_share(100_000), 10_000);
        assert_eq!(default_partition_share(25), 2);
        assert_eq!(default_partition_share(3), 1);
        let limits = MemoryLimits::new(1_000, 64);
        assert_eq!(
            (
                limits.max_entries_per_partition,
                limits.max_bytes_per_partition
            ),
            (100, 6)
        );
        assert_eq!(
            MemoryError::Full {
                retry_after_ms: 250
            }
            .retry_after_ms(),
            250
        );
        assert_eq!(
            MemoryError::QuotaExceeded { retry_after_ms: 40 }.retry_after_ms(),
            40
        );
    }

    #[test]
    fn refusals_purges_and_sizes_read_back() {
        assert_eq!(MemoryError::Full { retry_after_ms: 1 }.as_str(), "full");
        assert_eq!(
            MemoryError::QuotaExceeded { retry_after_ms: 1 }.as_str(),
            "quota_exceeded"
        );
        let counts = PurgeCounts {
            in_progress: 2,
            completed: 3,
            outcome_unknown: 5,
        };
        assert_eq!(counts.total(), 10);
        assert_eq!(PurgeCounts::default().total(), 0);
        let completed = |headers: Vec<(String, String)>, body: &[u8]| Record {
            fingerprint: fp(),
            generation: 1,
            token: A,
            expires_at_ms: 10,
            state: RecordState::Completed {
                response: StoredResponse {
                    status: 201,
                    headers,
                    body: body.to_vec(),
                },
            },
        };
        // 160 overhead + 5 ("v1:aa") + body 4 + header names and values 12 + 7.
        assert_eq!(
            record_bytes(&completed(
                vec![
                    ("content-type".into(), "a/b".into()),
                    ("x-a".into(), "1234".into())
                ],
                b"body"
            )),
            RECORD_OVERHEAD_BYTES + 5 + 4 + 12 + 3 + 3 + 4
        );
        let m = MemoryStore::new(limits(7, 3));
        assert_eq!(m.limits(), limits(7, 3));
        assert!(m.is_empty());
        let mut m = m;
        let _ = m.claim(scope(1), None, &fp(), A, 10, 100, 1_000);
        assert!(!m.is_empty());
    }

    /// Removing a record gives its partition back what it held: its bytes (a quota of one
    /// record's size admits the next claim once the first is released) and its entry count
    /// (the partition is forgotten only when it holds nothing).
    #[test]
    fn a_removed_record_gives_its_partition_back_its_room() {
        let one = RECORD_OVERHEAD_BYTES + fp().as_str().len();
        let mut m = MemoryStore::new(MemoryLimits {
            max_entries: 10,
            max_bytes: usize::MAX,
            max_entries_per_partition: 10,
            max_bytes_per_partition: one,
        });
        let p = Some(Partition::of_principal("alice"));
        for round in 0..3u8 {
            let token = FencingToken([round; 16]);
            assert_eq!(
                m.claim(scope(1), p, &fp(), token, 10, 100, 1_000),
                Ok(ClaimOutcome::Claimed { generation: 1 }),
                "round {round}"
            );
            assert_eq!(m.partition_len(p), 1);
            assert!(matches!(
                m.claim(scope(2), p, &fp(), token, 10, 100, 1_000),
                Err(MemoryError::QuotaExceeded { .. })
            ));
            assert!(m.release(scope(1), token));
            assert_eq!(m.partition_len(p), 0);
            assert_eq!(m.bytes(), 0);
        }
        let mut m = MemoryStore::new(limits(10, 10));
        let _ = m.claim(scope(1), p, &fp(), A, 10, 100, 1_000);
        let _ = m.claim(scope(2), p, &fp(), A, 10, 100, 1_000);
        assert!(m.release(scope(1), A));
        assert_eq!(m.partition_len(p), 1, "one record left in the partition");
        // A partition that keeps a record: a quota of two records admits a third claim once
        // one of the two is released (its bytes are given back, not added again).
        let mut m = MemoryStore::new(MemoryLimits {
            max_entries: 10,
            max_bytes: usize::MAX,
            max_entries_per_partition: 10,
            max_bytes_per_partition: 2 * one,
        });
        for i in 1..=2 {
            assert!(m.claim(scope(i), p, &fp(), A, 10, 100, 1_000).is_ok());
        }
        assert!(m.release(scope(1), A));
        assert!(matches!(
            m.claim(scope(3), p, &fp(), A, 10, 100, 1_000),
            Ok(ClaimOutcome::Claimed { .. })
        ));
        assert!(matches!(
            m.claim(scope(4), p, &fp(), A, 10, 100, 1_000),
            Err(MemoryError::QuotaExceeded { .. })
        ));
        // Full to the byte: even a 2-byte response does not fit beside the two records.
        assert!(matches!(
            m.complete(scope(3), A, resp(), 100, 1_000),
            Err(MemoryError::QuotaExceeded { .. })
        ));
    }

    /// The byte limits are inclusive and count a claim as `record_bytes` of its record: two
    /// records fill a limit of exactly two records' size, a third is refused; a limit one byte
    /// short of two records refuses the second. The same holds for a partition's quota.
    #[test]
    fn byte_limits_are_inclusive_and_count_the_record() {
        let one = RECORD_OVERHEAD_BYTES + fp().as_str().len();
        let p = Some(Partition::of_principal("alice"));
        for (max_bytes, per_partition, partition) in
            [(2 * one, usize::MAX, None), (usize::MAX, 2 * one, p)]
        {
            let mut m = MemoryStore::new(MemoryLimits {
                max_entries: 10,
                max_bytes,
                max_entries_per_partition: 10,
                max_bytes_per_partition: per_partition,
            });
            for i in 1..=2 {
                assert!(
                    matches!(
                        m.claim(scope(i), partition, &fp(), A, 10, 100, 1_000),
                        Ok(ClaimOutcome::Claimed { .. })
                    ),
                    "record {i} fits"
                );
            }
            assert_eq!(m.bytes(), 2 * one);
            let third = m.claim(scope(3), partition, &fp(), A, 10, 100, 1_000);
            assert!(
                matches!(
                    (&third, partition),
                    (Err(MemoryError::Full { .. }), None)
                        | (Err(MemoryError::QuotaExceeded { .. }), Some(_))
                ),
                "{third:?}"
            );
        }
        let mut m = MemoryStore::new(MemoryLimits {
            max_entries: 10,
            max_bytes: 2 * one - 1,
            max_entries_per_partition: 10,
            max_bytes_per_partition: usize::MAX,
        });
        assert!(m.claim(scope(1), None, &fp(), A, 10, 100, 1_000).is_ok());
        assert!(matches!(
            m.claim(scope(2), None, &fp(), A, 10, 100, 1_000),
            Err(MemoryError::Full { .. })
        ));
    }

    #[test]
    fn takeover_needs_the_seen_token_and_an_expired_lease() {
        const B: FencingToken = FencingToken([0xb; 16]);
        let mut m = MemoryStore::new(limits(10, 10));
        assert_eq!(m.takeover(scope(1), A, B, 10, 1_000), None, "no record");
        let _ = m.claim(scope(1), None, &fp(), A, 10, 100, 1_000);
        assert_eq!(m.takeover(scope(1), A, B, 10, 1_005), None, "lease live");
        assert_eq!(
            m.takeover(scope(1), B, B, 10, 1_010),
            None,
            "not the seen token"
        );
        assert_eq!(m.takeover(scope(1), A, B, 10, 1_010), Some(1));
        assert_eq!(m.get(&scope(1)).map(|r| r.token), Some(B));
    }

    /// The store's primitives answer as core's (`store.rs`) on the record they hold: each
    /// needs the caller's token (the seen one for mark-unknown, after the lease) and leaves the
    /// record its contract says.
    #[test]
    fn the_primitives_need_their_token_and_leave_their_record() {
        const B: FencingToken = FencingToken([0xb; 16]);
        let mut m = MemoryStore::new(limits(10, 10));
        assert!(!m.mark_unknown(scope(1), A, 100, 1_000), "no record");
        assert!(!m.renew(scope(1), A, 10, 1_000), "no record");
        assert!(!m.release(scope(1), A), "no record");
        let _ = m.claim(scope(1), None, &fp(), A, 10, 100, 1_000);
        assert!(!m.mark_unknown(scope(1), A, 100, 1_005), "lease live");
        assert!(!m.renew(scope(1), B, 10, 1_005), "another token");
        assert!(m.renew(scope(1), A, 50, 1_005));
        assert_eq!(
            m.get(&scope(1)).map(|r| r.state.clone()),
            Some(RecordState::InProgress {
                lease_until_ms: 1_055
            })
        );
        assert!(!m.release(scope(1), B), "another token");
        assert_eq!(m.complete(scope(1), B, resp(), 100, 1_010), Ok(false));
        assert_eq!(m.complete(scope(1), A, resp(), 100, 1_010), Ok(true));
        assert!(matches!(
            m.get(&scope(1)).map(|r| &r.state),
            Some(RecordState::Completed { .. })
        ));
        assert!(!m.release(scope(1), A), "completed: not released");
        let _ = m.claim(scope(2), None, &fp(), A, 10, 100, 1_000);
        assert!(
            !m.mark_unknown(scope(2), B, 100, 1_020),
            "not the seen token"
        );
        assert!(m.mark_unknown(scope(2), A, 100, 1_020));
        assert_eq!(
            m.get(&scope(2)).map(|r| (r.state.clone(), r.expires_at_ms)),
            Some((RecordState::OutcomeUnknown, 1_120))
        );
        let _ = m.claim(scope(3), None, &fp(), A, 10, 100, 1_000);
        assert!(m.release(scope(3), A));
        assert_eq!(m.get(&scope(3)), None);
    }

    /// A purge counts what it deleted per state, and deletes only what is due.
    #[test]
    fn purge_counts_each_state_it_deleted() {
        let mut m = MemoryStore::new(limits(10, 10));
        for i in 1..=6 {
            let _ = m.claim(scope(i), None, &fp(), A, 10, 100, 1_000);
        }
        for i in 1..=3 {
            assert_eq!(m.complete(scope(i), A, resp(), 100, 1_000), Ok(true));
        }
        assert!(m.mark_unknown(scope(4), A, 100, 1_010));
        assert!(m.mark_unknown(scope(5), A, 100, 1_010));
        // Records 1-3 completed (expire at 1,100), 4-5 outcome-unknown (1,110), 6 in progress
        // (1,100): at 1,100 four are due, one of them in progress.
        let counts = m.purge_expired(100, 1_100);
        assert_eq!(
            counts,
            PurgeCounts {
                in_progress: 1,
                completed: 3,
                outcome_unknown: 0,
            }
        );
        assert_eq!(
            m.purge_expired(100, 1_110),
            PurgeCounts {
                in_progress: 0,
                completed: 0,
                outcome_unknown: 2,
            }
        );
        assert!(m.is_empty());
    }

    /// A completion by anyone but the owner of an in-progress record is a plain `false`, even on
    /// a full store: it never asks for room (no eviction, no refusal) it would not use.
    #[test]
    fn a_completion_without_the_record_is_false_even_when_full() {
        const B: FencingToken = FencingToken([0xb; 16]);
        let one = RECORD_OVERHEAD_BYTES + fp().as_str().len();
        let mut m = MemoryStore::new(MemoryLimits {
            max_entries: 10,
            max_bytes: one,
            max_entries_per_partition: 10,
            max_bytes_per_partition: usize::MAX,
        });
        let _ = m.claim(scope(1), None, &fp(), A, 10, 100, 1_000);
        assert_eq!(m.complete(scope(1), B, resp(), 100, 1_000), Ok(false));
        assert!(matches!(
            m.complete(scope(1), A, resp(), 100, 1_000),
            Err(MemoryError::Full { .. })
        ));
        let mut m = MemoryStore::new(limits(10, 10));
        let _ = m.claim(scope(1), None, &fp(), A, 10, 100, 1_000);
        assert_eq!(m.complete(scope(1), A, resp(), 100, 1_000), Ok(true));
        let full = MemoryLimits {
            max_bytes: m.bytes(),
            ..limits(10, 10)
        };
        let mut m2 = MemoryStore::new(full);
        let _ = m2.claim(scope(1), None, &fp(), A, 10, 100, 1_000);
        assert_eq!(m2.complete(scope(1), A, resp(), 100, 1_000), Ok(true));
        assert_eq!(
            m2.complete(scope(1), A, resp(), 100, 1_000),
            Ok(false),
            "completed: a second completion is false, not a refusal"
        );
    }

    /// A partition's entries, bytes and expiry index.
    type Held = (usize, usize, BTreeSet<(u64, ScopeId)>);

    /// The indexes and counters, recomputed from the records alone.
    fn assert_indexes_match_records(m: &MemoryStore) {
        let mut by_expiry = BTreeSet::new();
        let mut usage: BTreeMap<Option<Partition>, Held> = BTreeMap::new();
        let mut bytes = 0;
        for (k, e) in &m.records {
            assert_eq!(e.bytes, record_bytes(&e.record), "an entry's bytes");
            let at = (e.record.expires_at_ms, *k);
            by_expiry.insert(at);
            bytes += e.bytes;
            let u = usage.entry(e.partition).or_default();
            u.0 += 1;
            u.1 += e.bytes;
            u.2.insert(at);
        }
        assert_eq!(m.by_expiry, by_expiry, "the expiry index");
        assert_eq!(m.bytes, bytes, "the byte count");
        let held: BTreeMap<_, _> = m
            .usage
            .iter()
            .map(|(p, u)| (*p, (u.entries, u.bytes, u.by_expiry.clone())))
            .collect();
        assert_eq!(held, usage, "the partitions' counts and indexes");
    }

    #[test]
    fn every_primitive_keeps_the_indexes_true_to_the_records() {
        // A fixed pseudo-random walk over few scopes, partitions and tokens, with time moving,
        // so records are created, replaced when expired, changed in place, completed, released
        // and purged; the indexes are checked after every step.
        let mut m = MemoryStore::new(MemoryLimits::new(6, 1_000));
        let parts = [
            None,
            Some(Partition::of_principal("a")),
            Some(Partition::of_principal("b")),
        ];
        let tokens = [A, FencingToken([0xb; 16]), FencingToken([0xc; 16])];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut now = 1_000;
        let (mut changed, mut refused) = ([0; 8], 0);
        for _ in 0..5_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let pick = |n: u64, shift: u32| (x >> shift) % n;
            let s = scope(pick(8, 0) as u32);
            let t = tokens[pick(3, 8) as usize];
            let kind = pick(8, 16) as usize;
            let ok = match kind {
                0 | 1 => m
                    .claim(
                        s,
                        parts[pick(3, 24) as usize],
                        &fp(),
                        t,
                        20,
                        40 + pick(60, 32),
                        now,
                    )
                    .map(|o| matches!(o, ClaimOutcome::Claimed { .. })),
                2 => {
                    let r = StoredResponse {
                        status: 201,
                        headers: vec![("x".into(), "y".repeat(pick(40, 40) as usize))],
                        body: vec![b'b'; pick(90, 48) as usize],
                    };
                    m.complete(s, t, r, 30 + pick(90, 32), now)
                }
                3 => Ok(m.release(s, t)),
                4 => Ok(m.renew(s, t, 10 + pick(50, 32), now)),
                5 => Ok(m
                    .takeover(s, t, tokens[pick(3, 40) as usize], 25, now)
                    .is_some()),
                6 => Ok(m.mark_unknown(s, t, 50, now)),
                _ => Ok(m.purge_expired(pick(3, 32) as usize, now).total() > 0),
            };
            match ok {
                Ok(true) => changed[kind] += 1,
                Ok(false) => {}
                Err(_) => refused += 1,
            }
            assert_indexes_match_records(&m);
            now += pick(7, 56);
        }
        assert!(
            changed.iter().all(|&n| n >= 20) && refused >= 20,
            "the walk exercised little: {changed:?} changed per primitive, {refused} refused"
        );
    }
}
