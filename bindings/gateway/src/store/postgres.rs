//! The PostgreSQL store: core's recipe texts (`idempo_core::recipes::POSTGRES_*`,
//! `spec/STORAGE.md` §4) on `tokio-postgres`, as the Python and Node PostgreSQL stores run them,
//! so a gateway and a Python or Node service can share one table.
//!
//! - Every recipe runs as one unnamed extended-protocol statement with typed parameters
//!   (`query_typed` / `execute_typed`: one round trip, no named prepared statement, no session
//!   state), so the store works behind PgBouncer in transaction pooling mode.
//! - The clock override (the recipes' last parameter) is NULL in production.
//! - Each primitive, connecting included, is bounded by `timeout_ms` (`purge_timeout_ms` for a
//!   purge batch); a timeout or a connection error is [`StoreError`], so core answers 503 and
//!   nothing is forwarded. A connection whose statement did not finish is discarded, never reused.
//! - The claim that returns zero rows (the conflicting row is not in the statement's snapshot)
//!   runs again, up to [`CLAIM_ATTEMPTS`] times, as the bindings do.
//! - The schema is created in one transaction that first takes core's advisory lock
//!   (`POSTGRES_SCHEMA_LOCK`), so gateways starting together against an empty database wait for
//!   each other; with `schema`, the table is `"schema".idempo_record` (the whole word
//!   `idempo_record` replaced, never `idempo_record_expires_at`) and the schema is created too.
//! - Multi-host DSNs (`host=a,b` or `postgresql://a,b/db`) with `target_session_attrs=read-write`
//!   are tokio-postgres's own.
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempo_core::machine::memory::PurgeCounts;
use idempo_core::machine::{StoreOp, StoreResult};
use idempo_core::recipes;
use idempo_core::record::{Record, RecordRow};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, Row};

use super::{Clock, StoreError, bounded};

/// Claim attempts on zero rows before the claim fails as contended (as the Python and Node
/// stores).
pub const CLAIM_ATTEMPTS: u32 = 3;
/// Connections the pool holds at most when the configuration does not say.
pub const DEFAULT_POOL_SIZE: usize = 10;

/// How the PostgreSQL store connects and bounds its statements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    /// The libpq-style DSN (`postgresql://…` or `host=… dbname=…`), multi-host allowed.
    pub dsn: String,
    /// Connections held at most.
    pub pool_size: usize,
    /// `postgres_store.timeout_ms`: how long one primitive may take, connecting included.
    pub timeout_ms: u64,
    /// `postgres_store.purge_timeout_ms`: how long one purge batch may take.
    pub purge_timeout_ms: u64,
    /// The schema the table lives in (none: the connection's `search_path`).
    pub schema: Option<String>,
    /// Create the table, its index (and the schema) on open.
    pub create_schema: bool,
}

impl PostgresOptions {
    /// Options for `dsn` with core's defaults.
    #[must_use]
    pub fn new(dsn: impl Into<String>) -> Self {
        Self {
            dsn: dsn.into(),
            pool_size: DEFAULT_POOL_SIZE,
            timeout_ms: idempo_core::options::STORE_TIMEOUT_MS,
            purge_timeout_ms: idempo_core::options::PURGE_TIMEOUT_MS,
            schema: None,
            create_schema: true,
        }
    }
}

/// Core's recipe texts with the table renamed into the configured schema.
#[derive(Debug)]
struct Texts {
    schema_ddl: String,
    claim: String,
    get: String,
    takeover: String,
    mark_unknown: String,
    complete: String,
    release: String,
    renew: String,
    purge: String,
    ping: String,
}

/// `s` as a quoted SQL identifier.
fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

impl Texts {
    fn new(schema: Option<&str>) -> Self {
        let table = schema.map_or_else(
            || "idempo_record".to_owned(),
            |s| format!("{}.idempo_record", quote_ident(s)),
        );
        let r = |sql: &str| recipes::rename_table(sql, &table);
        let mut ddl = String::from("BEGIN;\n");
        ddl.push_str(recipes::POSTGRES_SCHEMA_LOCK);
        ddl.push('\n');
        if let Some(s) = schema {
            ddl.push_str(&format!(
                "CREATE SCHEMA IF NOT EXISTS {};\n",
                quote_ident(s)
            ));
        }
        ddl.push_str(&r(recipes::POSTGRES_SCHEMA));
        ddl.push_str(";\nCOMMIT;");
        Self {
            schema_ddl: ddl,
            claim: r(recipes::POSTGRES_CLAIM),
            get: r(recipes::POSTGRES_GET),
            takeover: r(recipes::POSTGRES_TAKEOVER),
            mark_unknown: r(recipes::POSTGRES_MARK_UNKNOWN),
            complete: r(recipes::POSTGRES_COMPLETE),
            release: r(recipes::POSTGRES_RELEASE),
            renew: r(recipes::POSTGRES_RENEW),
            purge: r(recipes::POSTGRES_PURGE),
            ping: format!("SELECT 1 FROM {table} LIMIT 1"),
        }
    }
}

#[derive(Debug)]
struct Inner {
    config: tokio_postgres::Config,
    idle: Mutex<Vec<Client>>,
    slots: Arc<Semaphore>,
    texts: Texts,
    timeout: Duration,
    purge_timeout: Duration,
    clock: Clock,
}

/// A PostgreSQL store: a bounded pool of `tokio-postgres` connections running core's recipes.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

/// A connection checked out of the pool; back to the pool only once its statement finished.
struct Conn {
    client: Option<Client>,
    inner: Arc<Inner>,
    done: bool,
    _slot: OwnedSemaphorePermit,
}

impl Conn {
    fn client(&self) -> Result<&Client, StoreError> {
        self.client
            .as_ref()
            .ok_or_else(|| StoreError::Unavailable("no connection".to_owned()))
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            if self.done && !c.is_closed() {
                self.inner
                    .idle
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(c);
            }
        }
    }
}

type Params<'a> = [(&'a (dyn ToSql + Sync), Type)];

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl PostgresStore {
    /// Parses the DSN, opens one connection (the server must answer within `timeout_ms`) and,
    /// with `create_schema`, creates the schema under core's advisory lock.
    ///
    /// # Errors
    /// [`StoreError::Config`] for a DSN tokio-postgres refuses; [`StoreError::Postgres`] or
    /// [`StoreError::Timeout`] when the server does not answer or refuses the DDL.
    pub async fn open(options: &PostgresOptions, clock: Clock) -> Result<Self, StoreError> {
        let mut config = tokio_postgres::Config::from_str(&options.dsn)
            .map_err(|e| StoreError::Config(format!("dsn: {e}")))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_millis(options.timeout_ms.max(1)));
        }
        if config.get_application_name().is_none() {
            config.application_name("idempo-gateway");
        }
        let store = Self {
            inner: Arc::new(Inner {
                config,
                idle: Mutex::new(Vec::new()),
                slots: Arc::new(Semaphore::new(options.pool_size.max(1))),
                texts: Texts::new(options.schema.as_deref()),
                timeout: Duration::from_millis(options.timeout_ms.max(1)),
                purge_timeout: Duration::from_millis(options.purge_timeout_ms.max(1)),
                clock,
            }),
        };
        if options.create_schema {
            store.create_schema().await?;
        } else {
            store.ping().await?;
        }
        Ok(store)
    }

    /// Creates the table and its index (and the schema, if set) if missing, in one transaction
    /// after core's advisory lock (`spec/STORAGE.md` §4.1). One simple-protocol query, so it also
    /// runs behind a transaction-mode pooler.
    ///
    /// # Errors
    /// [`StoreError`] when the server fails or does not answer within the purge timeout.
    pub async fn create_schema(&self) -> Result<(), StoreError> {
        bounded(self.inner.purge_timeout, "create_schema", async {
            let mut conn = self.checkout().await?;
            conn.client()?
                .batch_execute(&self.inner.texts.schema_ddl)
                .await?;
            conn.done = true;
            Ok(())
        })
        .await
    }

    async fn checkout(&self) -> Result<Conn, StoreError> {
        let slot = Arc::clone(&self.inner.slots)
            .acquire_owned()
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        loop {
            let idle = self
                .inner
                .idle
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .pop();
            match idle {
                Some(c) if c.is_closed() => {}
                Some(c) => {
                    return Ok(Conn {
                        client: Some(c),
                        inner: Arc::clone(&self.inner),
                        done: false,
                        _slot: slot,
                    });
                }
                None => break,
            }
        }
        let (client, connection) = self.inner.config.connect(NoTls).await?;
        tokio::spawn(async move {
            // The connection ends when its client is dropped or the server goes away; the
            // client's next statement then fails and the store answers unavailable.
            let _ = connection.await;
        });
        Ok(Conn {
            client: Some(client),
            inner: Arc::clone(&self.inner),
            done: false,
            _slot: slot,
        })
    }

    fn now(&self) -> Option<i64> {
        self.inner.clock.override_ms().map(int)
    }

    /// Runs one primitive on a pooled connection within `timeout_ms`.
    ///
    /// # Errors
    /// [`StoreError`] for any PostgreSQL failure, timeout or invalid row.
    pub async fn run(&self, op: StoreOp) -> Result<StoreResult, StoreError> {
        let name = op.name();
        bounded(self.inner.timeout, name, async {
            let mut conn = self.checkout().await?;
            let out = self.run_on(conn.client()?, op).await;
            conn.done = out.is_ok();
            out
        })
        .await
    }

    async fn run_on(&self, c: &Client, op: StoreOp) -> Result<StoreResult, StoreError> {
        let now = self.now();
        let t = &self.inner.texts;
        match op {
            StoreOp::Claim {
                scope,
                fingerprint,
                token,
                lease_ms,
                ttl_ms,
            } => {
                let (lease, ttl) = (int(lease_ms), int(ttl_ms));
                let (scope, fp, token) = (
                    scope.as_bytes().as_slice(),
                    fingerprint.as_str(),
                    token.as_bytes().as_slice(),
                );
                let params: [(&(dyn ToSql + Sync), Type); 6] = [
                    (&scope, Type::BYTEA),
                    (&fp, Type::TEXT),
                    (&token, Type::BYTEA),
                    (&lease, Type::INT8),
                    (&ttl, Type::INT8),
                    (&now, Type::INT8),
                ];
                claim(c, &t.claim, &params).await
            }
            StoreOp::Get { scope } => {
                let scope = scope.as_bytes().as_slice();
                let rows = c
                    .query_typed(&t.get, &[(&scope, Type::BYTEA), (&now, Type::INT8)])
                    .await?;
                let [row] = rows.as_slice() else {
                    return Err(StoreError::Corrupt(format!(
                        "get returned {} rows",
                        rows.len()
                    )));
                };
                Ok(StoreResult::Got {
                    record: record_at(row, 0)?,
                    now_ms: u64_of(row.try_get(7)?)?,
                })
            }
            StoreOp::TakeOver {
                scope,
                seen_token,
                new_token,
                lease_ms,
            } => {
                let (scope, seen, new, lease) = (
                    scope.as_bytes().as_slice(),
                    seen_token.as_bytes().as_slice(),
                    new_token.as_bytes().as_slice(),
                    int(lease_ms),
                );
                let rows = c
                    .query_typed(
                        &t.takeover,
                        &[
                            (&scope, Type::BYTEA),
                            (&seen, Type::BYTEA),
                            (&new, Type::BYTEA),
                            (&lease, Type::INT8),
                            (&now, Type::INT8),
                        ],
                    )
                    .await?;
                Ok(StoreResult::TookOver(match rows.first() {
                    Some(row) => Some(u32_of(row.try_get::<_, i32>(0)?)?),
                    None => None,
                }))
            }
            StoreOp::MarkUnknown {
                scope,
                seen_token,
                ttl_ms,
            } => {
                let (scope, seen, ttl) = (
                    scope.as_bytes().as_slice(),
                    seen_token.as_bytes().as_slice(),
                    int(ttl_ms),
                );
                let n = execute(
                    c,
                    &t.mark_unknown,
                    &[
                        (&scope, Type::BYTEA),
                        (&seen, Type::BYTEA),
                        (&ttl, Type::INT8),
                        (&now, Type::INT8),
                    ],
                )
                .await?;
                Ok(StoreResult::MarkedUnknown(n))
            }
            StoreOp::Complete {
                scope,
                token,
                response,
                ttl_ms,
            } => {
                let (scope, token, body, ttl) = (
                    scope.as_bytes().as_slice(),
                    token.as_bytes().as_slice(),
                    response.as_slice(),
                    int(ttl_ms),
                );
                let n = execute(
                    c,
                    &t.complete,
                    &[
                        (&scope, Type::BYTEA),
                        (&token, Type::BYTEA),
                        (&body, Type::BYTEA),
                        (&ttl, Type::INT8),
                        (&now, Type::INT8),
                    ],
                )
                .await?;
                Ok(StoreResult::Completed(n))
            }
            StoreOp::Release { scope, token } => {
                let (scope, token) = (scope.as_bytes().as_slice(), token.as_bytes().as_slice());
                let n = execute(
                    c,
                    &t.release,
                    &[(&scope, Type::BYTEA), (&token, Type::BYTEA)],
                )
                .await?;
                Ok(StoreResult::Released(n))
            }
            StoreOp::Renew {
                scope,
                token,
                lease_ms,
            } => {
                let (scope, token, lease) = (
                    scope.as_bytes().as_slice(),
                    token.as_bytes().as_slice(),
                    int(lease_ms),
                );
                let n = execute(
                    c,
                    &t.renew,
                    &[
                        (&scope, Type::BYTEA),
                        (&token, Type::BYTEA),
                        (&lease, Type::INT8),
                        (&now, Type::INT8),
                    ],
                )
                .await?;
                Ok(StoreResult::Renewed(n))
            }
            StoreOp::Commit { .. } => Err(StoreError::Unsupported("COMMIT")),
        }
    }

    /// Deletes up to `batch` expired records (primitive 8) within `purge_timeout_ms`.
    ///
    /// # Errors
    /// [`StoreError`] when PostgreSQL fails or does not answer in time.
    pub async fn purge_expired(&self, batch: u64) -> Result<PurgeCounts, StoreError> {
        let now = self.now();
        bounded(self.inner.purge_timeout, "purge_expired", async {
            let mut conn = self.checkout().await?;
            let batch = int(batch);
            let rows = conn
                .client()?
                .query_typed(
                    &self.inner.texts.purge,
                    &[(&batch, Type::INT8), (&now, Type::INT8)],
                )
                .await?;
            let row = rows
                .first()
                .ok_or_else(|| StoreError::Corrupt("purge returned no row".to_owned()))?;
            let counts = PurgeCounts {
                in_progress: u64_of(row.try_get(0)?)?,
                completed: u64_of(row.try_get(1)?)?,
                outcome_unknown: u64_of(row.try_get(2)?)?,
            };
            conn.done = true;
            Ok(counts)
        })
        .await
    }

    /// Reads the table (readiness: the server answers and the table exists).
    ///
    /// # Errors
    /// [`StoreError`] when it does not within `timeout_ms`.
    pub async fn ping(&self) -> Result<(), StoreError> {
        bounded(self.inner.timeout, "ping", async {
            let mut conn = self.checkout().await?;
            conn.client()?
                .query_typed(&self.inner.texts.ping, &[])
                .await?;
            conn.done = true;
            Ok(())
        })
        .await
    }
}

/// The claim (primitive 1), run again while it returns zero rows.
async fn claim(c: &Client, sql: &str, params: &Params<'_>) -> Result<StoreResult, StoreError> {
    for _ in 0..CLAIM_ATTEMPTS {
        let rows = c.query_typed(sql, params).await?;
        let Some(row) = rows.first() else { continue };
        if rows.len() > 1 {
            return Err(StoreError::Corrupt(format!(
                "claim returned {} rows",
                rows.len()
            )));
        }
        let now_ms = u64_of(row.try_get(8)?)?;
        if row.try_get::<_, bool>(0)? {
            return Ok(StoreResult::Claimed {
                generation: u32_of(row.try_get::<_, i32>(4)?)?,
                now_ms,
            });
        }
        if let Some(record) = record_at(row, 1)? {
            if !record.is_expired(now_ms) {
                return Ok(StoreResult::Existing { record, now_ms });
            }
        }
    }
    Err(StoreError::Contention(CLAIM_ATTEMPTS))
}

/// Runs a write recipe: applied when it changed exactly one row.
async fn execute(c: &Client, sql: &str, params: &Params<'_>) -> Result<bool, StoreError> {
    match c.execute_typed(sql, params).await? {
        0 => Ok(false),
        1 => Ok(true),
        n => Err(StoreError::Corrupt(format!("{n} rows changed for one key"))),
    }
}

fn u64_of(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|e| StoreError::Corrupt(format!("{v}: {e}")))
}

fn u32_of(v: i32) -> Result<u32, StoreError> {
    u32::try_from(v).map_err(|e| StoreError::Corrupt(format!("{v}: {e}")))
}

/// The record columns of a claim's or a get's row from column `from` (`fingerprint`, `state`,
/// `token`, `generation`, `lease_until`, `expires_at`, `response`); none when absent.
fn record_at(row: &Row, from: usize) -> Result<Option<Record>, StoreError> {
    let fingerprint: Option<String> = row.try_get(from)?;
    let Some(fingerprint) = fingerprint else {
        return Ok(None);
    };
    let state: i16 = row.try_get(from + 1)?;
    let generation: i32 = row.try_get(from + 3)?;
    Record::from_row(RecordRow {
        fingerprint,
        state: i64::from(state),
        token: row.try_get(from + 2)?,
        generation: i64::from(generation),
        lease_until_ms: row.try_get(from + 4)?,
        expires_at_ms: row.try_get(from + 5)?,
        response: row.try_get(from + 6)?,
    })
    .map(Some)
    .map_err(|e| StoreError::Corrupt(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_renamed_by_whole_word_only() {
        let t = Texts::new(Some("gw"));
        assert!(t.schema_ddl.contains("CREATE SCHEMA IF NOT EXISTS \"gw\";"));
        assert!(
            t.schema_ddl
                .contains("idempo_record_expires_at ON \"gw\".idempo_record")
        );
        assert!(
            t.schema_ddl
                .starts_with("BEGIN;\nSELECT pg_advisory_xact_lock")
        );
        assert!(t.claim.contains("INSERT INTO \"gw\".idempo_record AS r"));
        assert!(!t.claim.contains(" idempo_record "));
        let plain = Texts::new(None);
        assert_eq!(plain.claim, recipes::POSTGRES_CLAIM);
        assert_eq!(plain.purge, recipes::POSTGRES_PURGE);
        assert_eq!(
            recipes::rename_table(
                "idempo_record_expires_at idempo_record x_idempo_record",
                "t"
            ),
            "idempo_record_expires_at t x_idempo_record"
        );
    }

    #[test]
    fn a_bad_dsn_is_a_config_error() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        let Ok(rt) = rt else { return };
        let r = rt.block_on(PostgresStore::open(
            &PostgresOptions::new("postgresql://h:notaport/db"),
            Clock::System,
        ));
        assert!(matches!(r, Err(StoreError::Config(_))), "{r:?}");
    }
}
