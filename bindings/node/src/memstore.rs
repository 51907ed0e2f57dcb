//! The in-memory store: core's pure storage primitives (`idempo_core::machine::store`) applied
//! to a map, one synchronous call per primitive (atomic in Node's single thread).
use std::collections::{BTreeSet, HashMap};

use idempo_core::machine::store as prim;
use idempo_core::record::{FencingToken, FingerprintText, Record, RecordState, StoredResponse};
use napi::Env;
use napi_derive::napi;

use crate::error::{Fail, code};
use crate::num::to_u64;
use crate::record::{RecordRowData, from_record};

/// Claim's answer: `claimed` with the generation, or the live record.
#[napi(object)]
pub struct MemoryClaim {
    /// True when a new record was inserted.
    pub claimed: bool,
    /// The new record's generation (when claimed).
    pub generation: Option<u32>,
    /// The live record (when not claimed).
    pub record: Option<RecordRowData>,
}

/// Rows deleted by one purge, per state.
#[napi(object)]
pub struct PurgeCounts {
    /// In-progress rows deleted.
    pub in_progress: u32,
    /// Completed rows deleted.
    pub completed: u32,
    /// Outcome-unknown rows deleted.
    pub outcome_unknown: u32,
}

fn scope_key(b: &[u8]) -> Result<[u8; 32], Fail> {
    b.try_into()
        .map_err(|_| Fail::new(code::INVALID_ARGUMENT, "a scope key is 32 bytes"))
}

fn token(b: &[u8]) -> Result<FencingToken, Fail> {
    FencingToken::from_slice(b).map_err(|e| Fail::new(code::INVALID_ARGUMENT, e.to_string()))
}

fn body_bytes(r: &Record) -> usize {
    match &r.state {
        RecordState::Completed { response } => {
            response.body.len()
                + response
                    .headers
                    .iter()
                    .map(|(n, v)| n.len() + v.len())
                    .sum::<usize>()
        }
        _ => 0,
    }
}

/// A bounded map of records; the clock is supplied by the caller on every call.
#[napi]
pub struct MemoryStoreCore {
    map: HashMap<[u8; 32], Record>,
    /// Every record's (expiry, key), earliest first: sweeps, purges and evictions take from the
    /// front instead of scanning the map.
    by_expiry: BTreeSet<(u64, [u8; 32])>,
    max_entries: usize,
    max_bytes: usize,
    bytes: usize,
    evicted_live: u32,
    ops: u32,
}

/// Claims between two lazy sweeps of expired records.
const SWEEP_EVERY: u32 = 128;
/// Most expired records one sweep deletes.
const SWEEP_MAX: usize = 64;

#[napi]
impl MemoryStoreCore {
    /// A store holding at most `maxEntries` records and `maxBytes` of stored responses.
    #[napi(constructor)]
    #[must_use]
    pub fn new(max_entries: u32, max_bytes: f64) -> Self {
        Self {
            map: HashMap::new(),
            by_expiry: BTreeSet::new(),
            max_entries: max_entries as usize,
            max_bytes: to_u64(max_bytes, "maxBytes")
                .ok()
                .and_then(|v| usize::try_from(v).ok())
                .unwrap_or(usize::MAX),
            bytes: 0,
            evicted_live: 0,
            ops: 0,
        }
    }

    /// Number of records held (expired ones included until purged or evicted).
    #[napi(getter)]
    #[must_use]
    pub fn size(&self) -> u32 {
        u32::try_from(self.map.len()).unwrap_or(u32::MAX)
    }

    /// Completed records evicted before their expiry (retention cut short).
    #[napi(getter)]
    #[must_use]
    pub fn evicted_live(&self) -> u32 {
        self.evicted_live
    }

    fn with_slot<T>(&mut self, k: [u8; 32], f: impl FnOnce(&mut Option<Record>) -> T) -> T {
        let mut slot = self.map.remove(&k);
        let before = slot.as_ref().map_or(0, body_bytes);
        let expiry_before = slot.as_ref().map(|r| r.expires_at_ms);
        let out = f(&mut slot);
        let after = slot.as_ref().map_or(0, body_bytes);
        self.bytes = self.bytes - before + after;
        let expiry_after = slot.as_ref().map(|r| r.expires_at_ms);
        if expiry_before != expiry_after {
            if let Some(e) = expiry_before {
                self.by_expiry.remove(&(e, k));
            }
            if let Some(e) = expiry_after {
                self.by_expiry.insert((e, k));
            }
        }
        if let Some(r) = slot {
            self.map.insert(k, r);
        }
        out
    }

    fn remove(&mut self, k: &[u8; 32]) -> Option<Record> {
        let r = self.map.remove(k)?;
        self.bytes -= body_bytes(&r);
        self.by_expiry.remove(&(r.expires_at_ms, *k));
        Some(r)
    }

    /// The expired records, earliest expiry first, at most `max` of them.
    fn expired_keys(&self, now: u64, max: usize) -> Vec<[u8; 32]> {
        self.by_expiry
            .iter()
            .take_while(|(e, _)| *e <= now)
            .take(max)
            .map(|(_, k)| *k)
            .collect()
    }

    /// Deletes up to [`SWEEP_MAX`] expired records (nothing outlives the process, so this only
    /// bounds memory between purges).
    fn sweep(&mut self, now: u64) {
        for k in self.expired_keys(now, SWEEP_MAX) {
            self.remove(&k);
        }
    }

    /// Makes room for `extra` more entries / `extra_bytes` more bytes: expired records first,
    /// then completed ones with the earliest expiry. Never in-progress or outcome-unknown ones.
    fn make_room(&mut self, extra: usize, extra_bytes: usize, now: u64) -> bool {
        let full =
            |s: &Self| s.map.len() + extra > s.max_entries || s.bytes + extra_bytes > s.max_bytes;
        if !full(self) {
            return true;
        }
        for k in self.expired_keys(now, usize::MAX) {
            self.remove(&k);
        }
        while full(self) {
            let victim = self.by_expiry.iter().map(|(_, k)| *k).find(|k| {
                self.map
                    .get(k)
                    .is_some_and(|r| matches!(r.state, RecordState::Completed { .. }))
            });
            match victim {
                Some(k) => {
                    self.remove(&k);
                    self.evicted_live = self.evicted_live.saturating_add(1);
                }
                None => return false,
            }
        }
        true
    }

    /// Primitive 1 (positional arguments keep the JS call allocation-free). Throws `STORE_UNAVAILABLE` (reason `store_full`) when no room can be made.
    #[napi(catch_unwind)]
    #[allow(clippy::too_many_arguments)]
    pub fn claim(
        &mut self,
        env: Env,
        scope: &[u8],
        fingerprint: String,
        token_bytes: &[u8],
        lease_ms: f64,
        ttl_ms: f64,
        now_ms: f64,
    ) -> napi::Result<MemoryClaim> {
        let run = |s: &mut Self| -> Result<MemoryClaim, Fail> {
            let k = scope_key(scope)?;
            let fp = FingerprintText::new(fingerprint)
                .map_err(|e| Fail::new(code::INVALID_ARGUMENT, e.to_string()))?;
            let t = token(token_bytes)?;
            let (lease, ttl, now) = (
                to_u64(lease_ms, "leaseMs")?,
                to_u64(ttl_ms, "ttlMs")?,
                to_u64(now_ms, "nowMs")?,
            );
            s.ops = s.ops.wrapping_add(1);
            if s.ops.is_multiple_of(SWEEP_EVERY) {
                s.sweep(now);
            }
            let live = s.map.get(&k).is_some_and(|r| !r.is_expired(now));
            if !live && !s.map.contains_key(&k) && !s.make_room(1, 0, now) {
                return Err(
                    Fail::new(code::STORE_UNAVAILABLE, "the memory store is full")
                        .reason("store_full"),
                );
            }
            match s.with_slot(k, |slot| prim::claim(slot, &fp, t, lease, ttl, now)) {
                prim::ClaimOutcome::Claimed { generation } => Ok(MemoryClaim {
                    claimed: true,
                    generation: Some(generation),
                    record: None,
                }),
                prim::ClaimOutcome::Existing(r) => Ok(MemoryClaim {
                    claimed: false,
                    generation: None,
                    record: Some(from_record(&r)?),
                }),
            }
        };
        run(self).map_err(|f| f.throw(&env))
    }

    /// Primitive 2 (may return an expired record).
    #[napi(catch_unwind)]
    pub fn get(&self, env: Env, scope: &[u8]) -> napi::Result<Option<RecordRowData>> {
        let run = || -> Result<Option<RecordRowData>, Fail> {
            self.map
                .get(&scope_key(scope)?)
                .map(from_record)
                .transpose()
        };
        run().map_err(|f| f.throw(&env))
    }

    /// Primitive 3.
    #[napi(catch_unwind)]
    pub fn takeover(
        &mut self,
        env: Env,
        scope: &[u8],
        seen: &[u8],
        new_token: &[u8],
        lease_ms: f64,
        now_ms: f64,
    ) -> napi::Result<Option<u32>> {
        let run = |s: &mut Self| -> Result<Option<u32>, Fail> {
            let (k, seen, new) = (scope_key(scope)?, token(seen)?, token(new_token)?);
            let (lease, now) = (to_u64(lease_ms, "leaseMs")?, to_u64(now_ms, "nowMs")?);
            Ok(s.with_slot(k, |slot| prim::takeover(slot, seen, new, lease, now)))
        };
        run(self).map_err(|f| f.throw(&env))
    }

    /// Primitive 4.
    #[napi(catch_unwind)]
    pub fn mark_unknown(
        &mut self,
        env: Env,
        scope: &[u8],
        seen: &[u8],
        ttl_ms: f64,
        now_ms: f64,
    ) -> napi::Result<bool> {
        let run = |s: &mut Self| -> Result<bool, Fail> {
            let (k, seen) = (scope_key(scope)?, token(seen)?);
            let (ttl, now) = (to_u64(ttl_ms, "ttlMs")?, to_u64(now_ms, "nowMs")?);
            Ok(s.with_slot(k, |slot| prim::mark_unknown(slot, seen, ttl, now)))
        };
        run(self).map_err(|f| f.throw(&env))
    }

    /// Primitive 5. `response` is the encoded column (decoded by core; a malformed value throws
    /// `RECORD_CORRUPT`). Throws `STORE_UNAVAILABLE` (`store_full`) when the bytes do not fit.
    #[napi(catch_unwind)]
    pub fn complete(
        &mut self,
        env: Env,
        scope: &[u8],
        token_bytes: &[u8],
        response: &[u8],
        ttl_ms: f64,
        now_ms: f64,
    ) -> napi::Result<bool> {
        let run = |s: &mut Self| -> Result<bool, Fail> {
            let (k, t) = (scope_key(scope)?, token(token_bytes)?);
            let (ttl, now) = (to_u64(ttl_ms, "ttlMs")?, to_u64(now_ms, "nowMs")?);
            let resp = StoredResponse::decode(response)
                .map_err(|e| Fail::new(code::RECORD_CORRUPT, e.to_string()))?;
            let size = resp.body.len()
                + resp
                    .headers
                    .iter()
                    .map(|(n, v)| n.len() + v.len())
                    .sum::<usize>();
            let owned = s
                .map
                .get(&k)
                .is_some_and(|r| r.token == t && matches!(r.state, RecordState::InProgress { .. }));
            if owned && !s.make_room(0, size, now) {
                return Err(
                    Fail::new(code::STORE_UNAVAILABLE, "the memory store is full")
                        .reason("store_full"),
                );
            }
            Ok(s.with_slot(k, |slot| prim::complete(slot, t, resp, ttl, now)))
        };
        run(self).map_err(|f| f.throw(&env))
    }

    /// Primitive 6.
    #[napi(catch_unwind)]
    pub fn release(&mut self, env: Env, scope: &[u8], token_bytes: &[u8]) -> napi::Result<bool> {
        let run = |s: &mut Self| -> Result<bool, Fail> {
            let (k, t) = (scope_key(scope)?, token(token_bytes)?);
            Ok(s.with_slot(k, |slot| prim::release(slot, t)))
        };
        run(self).map_err(|f| f.throw(&env))
    }

    /// Primitive 7.
    #[napi(catch_unwind)]
    pub fn renew(
        &mut self,
        env: Env,
        scope: &[u8],
        token_bytes: &[u8],
        lease_ms: f64,
        now_ms: f64,
    ) -> napi::Result<bool> {
        let run = |s: &mut Self| -> Result<bool, Fail> {
            let (k, t) = (scope_key(scope)?, token(token_bytes)?);
            let (lease, now) = (to_u64(lease_ms, "leaseMs")?, to_u64(now_ms, "nowMs")?);
            Ok(s.with_slot(k, |slot| prim::renew(slot, t, lease, now)))
        };
        run(self).map_err(|f| f.throw(&env))
    }

    /// Primitive 8: deletes at most `batch` expired records, earliest expiry first.
    #[napi(catch_unwind)]
    pub fn purge_expired(
        &mut self,
        env: Env,
        batch: u32,
        now_ms: f64,
    ) -> napi::Result<PurgeCounts> {
        let now = to_u64(now_ms, "nowMs").map_err(|f| f.throw(&env))?;
        let due: Vec<[u8; 32]> = self
            .expired_keys(now, batch as usize)
            .into_iter()
            .filter(|k| self.map.get(k).is_some_and(|r| prim::purgeable(r, now)))
            .collect();
        let mut counts = PurgeCounts {
            in_progress: 0,
            completed: 0,
            outcome_unknown: 0,
        };
        for k in due {
            if let Some(r) = self.remove(&k) {
                match r.state {
                    RecordState::InProgress { .. } => counts.in_progress += 1,
                    RecordState::Completed { .. } => counts.completed += 1,
                    RecordState::OutcomeUnknown => counts.outcome_unknown += 1,
                }
            }
        }
        Ok(counts)
    }
}
