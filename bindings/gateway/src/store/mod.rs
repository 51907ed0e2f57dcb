//! The stores the gateway runs core's store primitives on (`spec/STORAGE.md` §3): core's
//! in-memory store, SQLite and PostgreSQL with core's recipe texts, and Redis (one server or a
//! cluster) with core's Lua scripts. Each [`StoreOp`] runs atomically and
//! answers the [`StoreResult`] core's flow expects; any error is a [`StoreError`], which the
//! flow turns into a fail-closed 503.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use idempo_core::machine::StoreOp;
use idempo_core::machine::StoreResult;
use idempo_core::machine::memory::{Partition, PurgeCounts};

pub mod memory;
pub mod postgres;
pub mod redis;
pub mod sqlite;

/// Runs one store operation `work` within `limit` (for the network stores, that includes waiting
/// for a connection): past it, [`StoreError::Timeout`] naming `op`.
pub(crate) async fn bounded<T>(
    limit: std::time::Duration,
    op: &'static str,
    work: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, work).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Timeout {
            op,
            ms: u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
        }),
    }
}

/// Why a store primitive failed (the request fails closed).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite answered an error (locked past the busy timeout, I/O, corrupt file...).
    #[error("SQLite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// SQLite failed the transaction this primitive was batched in (its `BEGIN` or `COMMIT`,
    /// or an error that rolled the whole transaction back): the primitive did not take effect.
    #[error("SQLite: {0} (the group commit this primitive was part of)")]
    SqliteBatch(String),
    /// A row read from the store is not a valid record.
    #[error("invalid record in the store: {0}")]
    Corrupt(String),
    /// The memory store is full or the principal is over its quota.
    #[error("memory store: {0}")]
    Memory(String),
    /// The claim kept finding a record that changed under it.
    #[error("the record kept changing over {0} claim attempts")]
    Contention(u32),
    /// The worker thread running the statement went away.
    #[error("the store's worker thread failed: {0}")]
    Worker(String),
    /// PostgreSQL answered an error, or the connection to it failed or closed.
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// Redis answered an error, or the connection to the server or the cluster failed or closed.
    #[error(
        "Redis: {0} (check that the server in [store] url, or the nodes in cluster_nodes, are up and reachable from the gateway)"
    )]
    Redis(#[from] ::redis::RedisError),
    /// The store did not answer within its deadline (`timeout_ms`, `purge_timeout_ms`).
    #[error("the store did not answer {op} within {ms} ms")]
    Timeout {
        /// The primitive that timed out.
        op: &'static str,
        /// The deadline it had.
        ms: u64,
    },
    /// The store cannot be reached (its connection pool is closed).
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    /// The store's configuration is invalid (a DSN the driver refuses).
    #[error("store configuration: {0}")]
    Config(String),
    /// The store cannot run this primitive (transactional `COMMIT`: not offered).
    #[error("the gateway's stores do not run {0}")]
    Unsupported(&'static str),
}

/// The store's clock: the system clock, or a fixed time set by a conformance test.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// Unix milliseconds of the system clock (SQLite: its own clock expression).
    #[default]
    System,
    /// A clock the test advances (SQLite: bound to `:now`).
    Fixed(Arc<AtomicU64>),
}

impl Clock {
    /// The override to bind to `:now`, if any.
    #[must_use]
    pub fn override_ms(&self) -> Option<u64> {
        match self {
            Self::System => None,
            Self::Fixed(t) => Some(t.load(Ordering::SeqCst)),
        }
    }

    /// The time now, in unix milliseconds.
    #[must_use]
    pub fn now_ms(&self) -> u64 {
        self.override_ms().unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        })
    }
}

/// One of the gateway's stores.
#[derive(Debug, Clone)]
pub enum Store {
    /// Core's bounded in-memory store.
    Memory(memory::MemStore),
    /// A SQLite file.
    Sqlite(sqlite::SqliteStore),
    /// A PostgreSQL table (directly or behind PgBouncer).
    Postgres(postgres::PostgresStore),
    /// Redis: one server or a Redis Cluster.
    Redis(redis::RedisStore),
}

impl Store {
    /// Runs one primitive atomically. `partition` is the principal's quota partition (the
    /// memory store holds each principal to a quota; the other stores ignore it).
    ///
    /// # Errors
    /// [`StoreError`] for any failure: the flow answers 503.
    pub async fn run(
        &self,
        op: StoreOp,
        partition: Option<Partition>,
    ) -> Result<StoreResult, StoreError> {
        match self {
            Self::Memory(m) => m.run(op, partition),
            Self::Sqlite(s) => s.run(op).await,
            Self::Postgres(p) => p.run(op).await,
            Self::Redis(r) => r.run(op).await,
        }
    }

    /// Deletes up to `batch` expired records (primitive 8).
    ///
    /// # Errors
    /// [`StoreError`] when the store fails.
    pub async fn purge_expired(&self, batch: u64) -> Result<PurgeCounts, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.purge_expired(batch)),
            Self::Sqlite(s) => s.purge_expired(batch).await,
            Self::Postgres(p) => p.purge_expired(batch).await,
            Self::Redis(r) => r.purge_expired(batch).await,
        }
    }

    /// Checks the store answers (readiness).
    ///
    /// # Errors
    /// [`StoreError`] when it does not.
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Self::Memory(_) => Ok(()),
            Self::Sqlite(s) => s.ping().await,
            Self::Postgres(p) => p.ping().await,
            Self::Redis(r) => r.ping().await,
        }
    }
}
