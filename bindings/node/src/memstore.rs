//! The in-memory store: a thin wrapper of core's bounded memory store
//! (`idempo_core::machine::memory`, `spec/STORAGE.md` §8), one synchronous call per primitive
//! (atomic in Node's single thread). Capacity, eviction (expired records only) and the
//! per-partition quotas are core's; this file only converts arguments and results.
use idempo_core::machine::memory::{
    self, MemoryError, MemoryLimits, MemoryStore, Partition, default_partition_share,
};
use idempo_core::machine::store::ClaimOutcome;
use idempo_core::record::{FencingToken, FingerprintText, StoredResponse};
use idempo_core::scope::ScopeId;
use napi::Env;
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

use crate::error::{Detail, Fail, code};
use crate::num::{from_u64, to_u64};
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

/// The memory store's partition of a principal (8 bytes): what `claim` takes as `partition`.
#[napi(catch_unwind)]
#[must_use]
pub fn memory_partition(principal: String) -> Buffer {
    Buffer::from(Partition::of_principal(&principal).as_bytes().to_vec())
}

fn scope_key(b: &[u8]) -> Result<ScopeId, Fail> {
    let bytes: [u8; 32] = b
        .try_into()
        .map_err(|_| Fail::new(code::INVALID_ARGUMENT, "a scope key is 32 bytes"))?;
    Ok(ScopeId::from_bytes(bytes))
}

fn token(b: &[u8]) -> Result<FencingToken, Fail> {
    FencingToken::from_slice(b).map_err(|e| Fail::new(code::INVALID_ARGUMENT, e.to_string()))
}

pub(crate) fn partition(b: Option<&[u8]>) -> Result<Option<Partition>, Fail> {
    b.map(|b| {
        b.try_into()
            .map(Partition)
            .map_err(|_| Fail::new(code::INVALID_ARGUMENT, "a partition is 8 bytes"))
    })
    .transpose()
}

fn limit(v: f64, name: &str) -> Result<usize, Fail> {
    let n = usize::try_from(to_u64(v, name)?).unwrap_or(usize::MAX);
    if n == 0 {
        return Err(Fail::new(
            code::INVALID_ARGUMENT,
            format!("{name} must be positive"),
        ));
    }
    Ok(n)
}

/// A refusal of core's store as `STORE_UNAVAILABLE` (reason `store_full` or
/// `partition_quota`, `retryAfterMs` set).
fn refused(e: MemoryError) -> Fail {
    let reason = match e {
        MemoryError::Full { .. } => "store_full",
        MemoryError::QuotaExceeded { .. } => "partition_quota",
    };
    Fail::new(code::STORE_UNAVAILABLE, e.to_string())
        .reason(reason)
        .with("retryAfterMs", Detail::Num(from_u64(e.retry_after_ms())))
}

/// Core's bounded memory store; the clock is supplied by the caller on every call.
#[napi]
pub struct MemoryStoreCore {
    pub(crate) inner: MemoryStore,
}

#[napi]
impl MemoryStoreCore {
    /// A store holding at most `maxEntries` records and `maxBytes` bytes, each partition at
    /// most `maxEntriesPerPartition` / `maxBytesPerPartition` (default: a tenth of the global
    /// limit, at least 1).
    #[napi(constructor)]
    pub fn new(
        env: Env,
        max_entries: f64,
        max_bytes: f64,
        max_entries_per_partition: Option<f64>,
        max_bytes_per_partition: Option<f64>,
    ) -> napi::Result<Self> {
        let run = || -> Result<Self, Fail> {
            let entries = limit(max_entries, "maxEntries")?;
            let bytes = limit(max_bytes, "maxBytes")?;
            let limits = MemoryLimits {
                max_entries: entries,
                max_bytes: bytes,
                max_entries_per_partition: match max_entries_per_partition {
                    Some(v) => limit(v, "maxEntriesPerPartition")?,
                    None => default_partition_share(entries),
                },
                max_bytes_per_partition: match max_bytes_per_partition {
                    Some(v) => limit(v, "maxBytesPerPartition")?,
                    None => default_partition_share(bytes),
                },
            };
            Ok(Self {
                inner: MemoryStore::new(limits),
            })
        };
        run().map_err(|f| f.throw(&env))
    }

    /// Number of records held (expired ones included until removed).
    #[napi(getter)]
    #[must_use]
    pub fn size(&self) -> u32 {
        u32::try_from(self.inner.len()).unwrap_or(u32::MAX)
    }

    /// Bytes held (160 per record plus its fingerprint and stored response).
    #[napi(getter)]
    #[must_use]
    pub fn bytes_used(&self) -> f64 {
        from_u64(self.inner.bytes() as u64)
    }

    /// The per-partition entry quota in force.
    #[napi(getter)]
    #[must_use]
    pub fn max_entries_per_partition(&self) -> f64 {
        from_u64(self.inner.limits().max_entries_per_partition as u64)
    }

    /// Primitive 1 (positional arguments keep the JS call allocation-free); `partition` (8
    /// bytes, see `memoryPartition`) is held to its quota. Throws `STORE_UNAVAILABLE` (reason
    /// `store_full` or `partition_quota`, with `retryAfterMs`) when the record does not fit.
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
        partition_bytes: Option<&[u8]>,
    ) -> napi::Result<MemoryClaim> {
        let run = |s: &mut Self| -> Result<MemoryClaim, Fail> {
            let k = scope_key(scope)?;
            let fp = FingerprintText::new(fingerprint)
                .map_err(|e| Fail::new(code::INVALID_ARGUMENT, e.to_string()))?;
            let t = token(token_bytes)?;
            let p = partition(partition_bytes)?;
            let (lease, ttl, now) = (
                to_u64(lease_ms, "leaseMs")?,
                to_u64(ttl_ms, "ttlMs")?,
                to_u64(now_ms, "nowMs")?,
            );
            match s
                .inner
                .claim(k, p, &fp, t, lease, ttl, now)
                .map_err(refused)?
            {
                ClaimOutcome::Claimed { generation } => Ok(MemoryClaim {
                    claimed: true,
                    generation: Some(generation),
                    record: None,
                }),
                ClaimOutcome::Existing(r) => Ok(MemoryClaim {
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
            self.inner
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
            Ok(s.inner.takeover(k, seen, new, lease, now))
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
            Ok(s.inner.mark_unknown(k, seen, ttl, now))
        };
        run(self).map_err(|f| f.throw(&env))
    }

    /// Primitive 5. `response` is the encoded column (decoded by core; a malformed value throws
    /// `RECORD_CORRUPT`). Throws `STORE_UNAVAILABLE` (`store_full` / `partition_quota`) when the
    /// response does not fit.
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
            s.inner.complete(k, t, resp, ttl, now).map_err(refused)
        };
        run(self).map_err(|f| f.throw(&env))
    }

    /// Primitive 6.
    #[napi(catch_unwind)]
    pub fn release(&mut self, env: Env, scope: &[u8], token_bytes: &[u8]) -> napi::Result<bool> {
        let run = |s: &mut Self| -> Result<bool, Fail> {
            Ok(s.inner.release(scope_key(scope)?, token(token_bytes)?))
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
            Ok(s.inner.renew(k, t, lease, now))
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
        let c: memory::PurgeCounts = self.inner.purge_expired(batch as usize, now);
        let n = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        Ok(PurgeCounts {
            in_progress: n(c.in_progress),
            completed: n(c.completed),
            outcome_unknown: n(c.outcome_unknown),
        })
    }
}
