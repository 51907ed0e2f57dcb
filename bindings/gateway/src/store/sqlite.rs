//! The SQLite store: core's recipe texts (`idempo_core::recipes::SQLITE_*`, `spec/STORAGE.md`
//! §7) on one file, as the Python and Node SQLite stores run them, so a gateway and a Python
//! service can share one file.
//!
//! Every connection runs `journal_mode = WAL` (retried while another connection opening the file
//! holds the lock, within the busy timeout), `synchronous = FULL` and `busy_timeout`; every
//! write primitive runs in `BEGIN IMMEDIATE … COMMIT`; the schema is created in one
//! `BEGIN IMMEDIATE` transaction. Statements run on tokio's blocking pool, never on the event
//! loop.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use idempo_core::busy;
use idempo_core::machine::memory::PurgeCounts;
use idempo_core::machine::{StoreOp, StoreResult};
use idempo_core::recipes;
use idempo_core::record::{Record, RecordRow};
use rusqlite::types::Value;
use rusqlite::{Connection, ErrorCode};

use super::{Clock, StoreError};

/// Claim attempts within one transaction before the claim fails as contended (as the Python and
/// Node stores).
const CLAIM_ATTEMPTS: u32 = 3;
/// The oldest SQLite with `RETURNING`.
const MIN_SQLITE: i32 = 3_035_000;

/// A SQLite store on one file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
    clock: Clock,
}

type Params = Vec<(&'static str, Value)>;

fn blob(b: &[u8]) -> Value {
    Value::Blob(b.to_vec())
}

fn int(v: u64) -> Value {
    Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))
}

impl SqliteStore {
    /// Opens `path` with the open procedure of `spec/STORAGE.md` §7 and creates the schema.
    ///
    /// # Errors
    /// [`StoreError::Sqlite`] naming the step that failed.
    pub fn open(path: &Path, busy_timeout_ms: u64, clock: Clock) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_millis(busy_timeout_ms))?;
        if rusqlite::version_number() < MIN_SQLITE {
            return Err(StoreError::Corrupt(format!(
                "SQLite {} is too old: idempo needs 3.35.0 or newer",
                rusqlite::version()
            )));
        }
        let since = Instant::now();
        let mut refused = 0_u32;
        loop {
            match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0)) {
                Ok(mode) if mode.eq_ignore_ascii_case("wal") => break,
                Ok(mode) => {
                    return Err(StoreError::Corrupt(format!(
                        "SQLite refused WAL mode for {} (journal_mode is {mode})",
                        path.display()
                    )));
                }
                Err(e) if is_busy(&e) => {
                    refused = refused.saturating_add(1);
                    let waited = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
                    match busy::setup_pause_ms(refused, waited, busy_timeout_ms) {
                        Some(pause) => std::thread::sleep(Duration::from_millis(pause)),
                        None => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        conn.execute_batch("PRAGMA synchronous = FULL")?;
        let store = Self {
            conn: Arc::new(Mutex::new(conn)),
            path: path.to_owned(),
            clock,
        };
        store.immediate(|c| {
            for statement in recipes::SQLITE_SCHEMA.split(';') {
                if !statement.trim().is_empty() {
                    c.execute_batch(statement)?;
                }
            }
            Ok(())
        })?;
        Ok(store)
    }

    /// The database file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` in `BEGIN IMMEDIATE … COMMIT` (rolled back on error).
    fn immediate<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = self.lock();
        conn.execute_batch("BEGIN IMMEDIATE")?;
        match f(&conn) {
            Ok(v) => match conn.execute_batch("COMMIT") {
                Ok(()) => Ok(v),
                Err(e) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    Err(e.into())
                }
            },
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Self) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || f(&me))
            .await
            .map_err(|e| StoreError::Worker(e.to_string()))?
    }

    /// Runs one primitive on the blocking pool.
    ///
    /// # Errors
    /// [`StoreError`] for any SQLite failure or invalid row.
    pub async fn run(&self, op: StoreOp) -> Result<StoreResult, StoreError> {
        self.blocking(move |s| s.run_sync(&op)).await
    }

    /// Runs one primitive on this thread.
    ///
    /// # Errors
    /// As [`SqliteStore::run`].
    pub fn run_sync(&self, op: &StoreOp) -> Result<StoreResult, StoreError> {
        let now = self.clock.override_ms().map(int).unwrap_or(Value::Null);
        match op {
            StoreOp::Claim {
                scope,
                fingerprint,
                token,
                lease_ms,
                ttl_ms,
            } => self.immediate(|c| {
                let params: Params = vec![
                    (":scope", blob(scope.as_bytes())),
                    (":fp", Value::Text(fingerprint.as_str().to_owned())),
                    (":token", blob(token.as_bytes())),
                    (":lease", int(*lease_ms)),
                    (":ttl", int(*ttl_ms)),
                    (":now", now.clone()),
                ];
                for _ in 0..CLAIM_ATTEMPTS {
                    let rows = query(c, recipes::SQLITE_CLAIM, &params)?;
                    if let Some(row) = rows.first() {
                        return Ok(StoreResult::Claimed {
                            generation: u32_at(row, 0)?,
                            now_ms: u64_at(row, 1)?,
                        });
                    }
                    let (record, now_ms) = get(c, scope.as_bytes(), &now)?;
                    if let Some(record) = record {
                        if !record.is_expired(now_ms) {
                            return Ok(StoreResult::Existing { record, now_ms });
                        }
                    }
                }
                Err(StoreError::Contention(CLAIM_ATTEMPTS))
            }),
            StoreOp::Get { scope } => {
                let conn = self.lock();
                let (record, now_ms) = get(&conn, scope.as_bytes(), &now)?;
                Ok(StoreResult::Got { record, now_ms })
            }
            StoreOp::TakeOver {
                scope,
                seen_token,
                new_token,
                lease_ms,
            } => self.immediate(|c| {
                let rows = query(
                    c,
                    recipes::SQLITE_TAKEOVER,
                    &vec![
                        (":scope", blob(scope.as_bytes())),
                        (":seen", blob(seen_token.as_bytes())),
                        (":new", blob(new_token.as_bytes())),
                        (":lease", int(*lease_ms)),
                        (":now", now.clone()),
                    ],
                )?;
                Ok(StoreResult::TookOver(match rows.first() {
                    Some(row) => Some(u32_at(row, 0)?),
                    None => None,
                }))
            }),
            StoreOp::MarkUnknown {
                scope,
                seen_token,
                ttl_ms,
            } => self.immediate(|c| {
                let n = execute(
                    c,
                    recipes::SQLITE_MARK_UNKNOWN,
                    &vec![
                        (":scope", blob(scope.as_bytes())),
                        (":seen", blob(seen_token.as_bytes())),
                        (":ttl", int(*ttl_ms)),
                        (":now", now.clone()),
                    ],
                )?;
                Ok(StoreResult::MarkedUnknown(n == 1))
            }),
            StoreOp::Complete {
                scope,
                token,
                response,
                ttl_ms,
            } => self.immediate(|c| {
                let n = execute(
                    c,
                    recipes::SQLITE_COMPLETE,
                    &vec![
                        (":scope", blob(scope.as_bytes())),
                        (":token", blob(token.as_bytes())),
                        (":response", blob(response)),
                        (":ttl", int(*ttl_ms)),
                        (":now", now.clone()),
                    ],
                )?;
                Ok(StoreResult::Completed(n == 1))
            }),
            StoreOp::Release { scope, token } => self.immediate(|c| {
                let n = execute(
                    c,
                    recipes::SQLITE_RELEASE,
                    &vec![
                        (":scope", blob(scope.as_bytes())),
                        (":token", blob(token.as_bytes())),
                    ],
                )?;
                Ok(StoreResult::Released(n == 1))
            }),
            StoreOp::Renew {
                scope,
                token,
                lease_ms,
            } => self.immediate(|c| {
                let n = execute(
                    c,
                    recipes::SQLITE_RENEW,
                    &vec![
                        (":scope", blob(scope.as_bytes())),
                        (":token", blob(token.as_bytes())),
                        (":lease", int(*lease_ms)),
                        (":now", now.clone()),
                    ],
                )?;
                Ok(StoreResult::Renewed(n == 1))
            }),
            StoreOp::Commit { .. } => Err(StoreError::Unsupported("COMMIT")),
        }
    }

    /// Deletes up to `batch` expired records in one `BEGIN IMMEDIATE`.
    ///
    /// # Errors
    /// [`StoreError`] when SQLite fails.
    pub async fn purge_expired(&self, batch: u64) -> Result<PurgeCounts, StoreError> {
        self.blocking(move |s| s.purge_sync(batch)).await
    }

    /// As [`SqliteStore::purge_expired`], on this thread.
    ///
    /// # Errors
    /// [`StoreError`] when SQLite fails.
    pub fn purge_sync(&self, batch: u64) -> Result<PurgeCounts, StoreError> {
        let now = self.clock.override_ms().map(int).unwrap_or(Value::Null);
        self.immediate(|c| {
            let rows = query(
                c,
                recipes::SQLITE_PURGE,
                &vec![(":batch", int(batch)), (":now", now)],
            )?;
            let mut counts = PurgeCounts::default();
            for row in &rows {
                match row.first() {
                    Some(Value::Integer(1)) => counts.in_progress += 1,
                    Some(Value::Integer(2)) => counts.completed += 1,
                    Some(Value::Integer(3)) => counts.outcome_unknown += 1,
                    other => return Err(StoreError::Corrupt(format!("purged state {other:?}"))),
                }
            }
            Ok(counts)
        })
    }

    /// Reads the table (readiness: the file opens and answers).
    ///
    /// # Errors
    /// [`StoreError`] when SQLite fails.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.blocking(|s| {
            let conn = s.lock();
            let mut stmt = conn.prepare_cached("SELECT 1 FROM idempo_record LIMIT 1")?;
            let mut rows = stmt.query([])?;
            let _ = rows.next()?;
            Ok(())
        })
        .await
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

fn prepare_bound<'c>(
    c: &'c Connection,
    sql: &str,
    params: &Params,
) -> Result<rusqlite::CachedStatement<'c>, StoreError> {
    let mut stmt = c.prepare_cached(sql)?;
    for (name, value) in params {
        if let Some(i) = stmt.parameter_index(name)? {
            stmt.raw_bind_parameter(i, value)?;
        }
    }
    Ok(stmt)
}

fn query(c: &Connection, sql: &str, params: &Params) -> Result<Vec<Vec<Value>>, StoreError> {
    let mut stmt = prepare_bound(c, sql, params)?;
    let n = stmt.column_count();
    let mut rows = stmt.raw_query();
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let mut vals = Vec::with_capacity(n);
        for i in 0..n {
            vals.push(row.get::<_, Value>(i)?);
        }
        out.push(vals);
    }
    Ok(out)
}

fn execute(c: &Connection, sql: &str, params: &Params) -> Result<usize, StoreError> {
    let mut stmt = prepare_bound(c, sql, params)?;
    Ok(stmt.raw_execute()?)
}

fn i64_at(row: &[Value], i: usize) -> Result<i64, StoreError> {
    match row.get(i) {
        Some(Value::Integer(v)) => Ok(*v),
        other => Err(StoreError::Corrupt(format!(
            "column {i}: expected an integer, got {other:?}"
        ))),
    }
}

fn u64_at(row: &[Value], i: usize) -> Result<u64, StoreError> {
    u64::try_from(i64_at(row, i)?).map_err(|e| StoreError::Corrupt(format!("column {i}: {e}")))
}

fn u32_at(row: &[Value], i: usize) -> Result<u32, StoreError> {
    u32::try_from(i64_at(row, i)?).map_err(|e| StoreError::Corrupt(format!("column {i}: {e}")))
}

/// Primitive 2 on `c`: the record (if any) and the store's now.
fn get(c: &Connection, scope: &[u8], now: &Value) -> Result<(Option<Record>, u64), StoreError> {
    let rows = query(
        c,
        recipes::SQLITE_GET,
        &vec![(":scope", blob(scope)), (":now", now.clone())],
    )?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt("get returned no row".to_owned()))?;
    let now_ms = u64_at(row, 7)?;
    let fingerprint = match row.first() {
        Some(Value::Null) | None => return Ok((None, now_ms)),
        Some(Value::Text(t)) => t.clone(),
        Some(other) => {
            return Err(StoreError::Corrupt(format!(
                "fingerprint: expected text, got {other:?}"
            )));
        }
    };
    let token = match row.get(2) {
        Some(Value::Blob(b)) => b.clone(),
        other => return Err(StoreError::Corrupt(format!("token: {other:?}"))),
    };
    let lease_until_ms = match row.get(4) {
        Some(Value::Null) => None,
        _ => Some(i64_at(row, 4)?),
    };
    let response = match row.get(6) {
        Some(Value::Blob(b)) => Some(b.clone()),
        Some(Value::Null) => None,
        other => return Err(StoreError::Corrupt(format!("response: {other:?}"))),
    };
    let record = Record::from_row(RecordRow {
        fingerprint,
        state: i64_at(row, 1)?,
        token,
        generation: i64_at(row, 3)?,
        lease_until_ms,
        expires_at_ms: i64_at(row, 5)?,
        response,
    })
    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok((Some(record), now_ms))
}
