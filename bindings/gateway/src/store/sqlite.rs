//! The SQLite store: core's recipe texts (`idempo_core::recipes::SQLITE_*`, `spec/STORAGE.md`
//! §7) on one file, as the Python and Node SQLite stores run them, so a gateway and a Python
//! service can share one file.
//!
//! Every connection runs `journal_mode = WAL` (retried while another connection opening the file
//! holds the lock, within the busy timeout), `synchronous = FULL` and `busy_timeout`; the schema
//! is created in one `BEGIN IMMEDIATE` transaction.
//!
//! **Group commit.** One writer thread owns the connection. Callers queue their primitive and
//! wait; the writer takes every queued primitive (at most [`MAX_BATCH`]) and runs the writes in
//! ONE `BEGIN IMMEDIATE … COMMIT`, each inside its own `SAVEPOINT` (a primitive that fails rolls
//! back only itself and answers its own error). Every waiter is answered only after `COMMIT`
//! returned, so a claim is reported claimed only once it is durable; if `BEGIN` or `COMMIT` fails,
//! every write of the batch answers the store error (the request fails closed). Reads (get,
//! readiness) run before the batch's transaction, outside it, so they see committed state only.
//! A fresh request is still two durable commits (claim, complete), but concurrent requests share
//! them: the disk's synchronous commit rate no longer caps the request rate.
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use idempo_core::busy;
use idempo_core::machine::memory::PurgeCounts;
use idempo_core::machine::{StoreOp, StoreResult};
use idempo_core::recipes;
use idempo_core::record::{Record, RecordRow};
use rusqlite::types::Value;
use rusqlite::{Connection, ErrorCode, Statement};
use tokio::sync::oneshot;

use super::{Clock, StoreError};

/// Claim attempts within one transaction before the claim fails as contended (as the Python and
/// Node stores).
const CLAIM_ATTEMPTS: u32 = 3;
/// The oldest SQLite with `RETURNING`.
const MIN_SQLITE: i32 = 3_035_000;
/// The most primitives one transaction of the writer runs.
pub const MAX_BATCH: usize = 64;
/// The bounds of the batch-size histogram (`idempo_gateway_sqlite_batch_size`).
pub const BATCH_SIZE_BUCKETS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// How many write primitives each transaction of the writer carried (a histogram with
/// [`BATCH_SIZE_BUCKETS`]; cumulative counts, as Prometheus exposes them).
#[derive(Debug, Default)]
pub struct BatchStats {
    le: [AtomicU64; BATCH_SIZE_BUCKETS.len()],
    sum: AtomicU64,
    count: AtomicU64,
}

impl BatchStats {
    fn record(&self, ops: usize) {
        let ops = u64::try_from(ops).unwrap_or(u64::MAX);
        for (c, bound) in self.le.iter().zip(BATCH_SIZE_BUCKETS) {
            if ops <= bound {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum.fetch_add(ops, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Transactions run (each one `BEGIN IMMEDIATE … COMMIT`).
    #[must_use]
    pub fn transactions(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Write primitives run in those transactions.
    #[must_use]
    pub fn ops(&self) -> u64 {
        self.sum.load(Ordering::Relaxed)
    }

    /// `(bound, transactions with at most bound primitives)` for each of [`BATCH_SIZE_BUCKETS`].
    #[must_use]
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        BATCH_SIZE_BUCKETS
            .iter()
            .zip(&self.le)
            .map(|(b, c)| (*b, c.load(Ordering::Relaxed)))
            .collect()
    }
}

/// What a caller queues for the writer.
#[derive(Debug)]
enum Work {
    Op(StoreOp),
    Purge(u64),
    Ping,
}

/// What the writer answers.
#[derive(Debug)]
enum Answer {
    Op(StoreResult),
    Purged(PurgeCounts),
    Pong,
}

type Reply = Result<Answer, StoreError>;

#[derive(Debug)]
enum Waiter {
    Async(oneshot::Sender<Reply>),
    Sync(mpsc::SyncSender<Reply>),
}

impl Waiter {
    fn answer(self, reply: Reply) {
        match self {
            Self::Async(tx) => {
                let _ = tx.send(reply);
            }
            Self::Sync(tx) => {
                let _ = tx.send(reply);
            }
        }
    }
}

#[derive(Debug)]
struct Job {
    work: Work,
    waiter: Waiter,
}

impl Job {
    fn is_read(&self) -> bool {
        matches!(
            self.work,
            Work::Ping | Work::Op(StoreOp::Get { .. } | StoreOp::Commit { .. })
        )
    }
}

/// A SQLite store on one file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    queue: mpsc::Sender<Job>,
    stats: Arc<BatchStats>,
    path: PathBuf,
}

type Params = Vec<(&'static str, Value)>;

fn blob(b: &[u8]) -> Value {
    Value::Blob(b.to_vec())
}

fn int(v: u64) -> Value {
    Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))
}

impl SqliteStore {
    /// Opens `path` with the open procedure of `spec/STORAGE.md` §7, creates the schema and
    /// starts the writer thread (it ends when the last clone of the store is dropped).
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
        immediate(&conn, |c| {
            for statement in recipes::SQLITE_SCHEMA.split(';') {
                if !statement.trim().is_empty() {
                    c.execute_batch(statement)?;
                }
            }
            Ok(())
        })?;
        let (queue, jobs) = mpsc::channel();
        let stats = Arc::new(BatchStats::default());
        let writer = Writer {
            conn,
            clock,
            stats: stats.clone(),
        };
        std::thread::Builder::new()
            .name("idempo-sqlite".to_owned())
            .spawn(move || writer.run(&jobs))
            .map_err(|e| StoreError::Worker(format!("cannot start the SQLite writer: {e}")))?;
        Ok(Self {
            queue,
            stats,
            path: path.to_owned(),
        })
    }

    /// The database file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The writer's batch sizes (the `idempo_gateway_sqlite_batch_size` histogram).
    #[must_use]
    pub fn batch_stats(&self) -> Arc<BatchStats> {
        self.stats.clone()
    }

    async fn submit(&self, work: Work) -> Reply {
        let (tx, rx) = oneshot::channel();
        self.queue
            .send(Job {
                work,
                waiter: Waiter::Async(tx),
            })
            .map_err(|_| StoreError::Worker("the SQLite writer thread has stopped".to_owned()))?;
        rx.await.map_err(|_| {
            StoreError::Worker("the SQLite writer thread dropped a request".to_owned())
        })?
    }

    fn submit_sync(&self, work: Work) -> Reply {
        let (tx, rx) = mpsc::sync_channel(1);
        self.queue
            .send(Job {
                work,
                waiter: Waiter::Sync(tx),
            })
            .map_err(|_| StoreError::Worker("the SQLite writer thread has stopped".to_owned()))?;
        rx.recv().map_err(|_| {
            StoreError::Worker("the SQLite writer thread dropped a request".to_owned())
        })?
    }

    /// Runs one primitive on the writer thread (batched with the other callers' primitives).
    ///
    /// # Errors
    /// [`StoreError`] for any SQLite failure or invalid row.
    pub async fn run(&self, op: StoreOp) -> Result<StoreResult, StoreError> {
        op_result(self.submit(Work::Op(op)).await)
    }

    /// As [`SqliteStore::run`], blocking this thread until the answer (never call it on an
    /// async runtime's thread).
    ///
    /// # Errors
    /// As [`SqliteStore::run`].
    pub fn run_sync(&self, op: &StoreOp) -> Result<StoreResult, StoreError> {
        op_result(self.submit_sync(Work::Op(op.clone())))
    }

    /// Deletes up to `batch` expired records (in the writer's transaction).
    ///
    /// # Errors
    /// [`StoreError`] when SQLite fails.
    pub async fn purge_expired(&self, batch: u64) -> Result<PurgeCounts, StoreError> {
        purge_result(self.submit(Work::Purge(batch)).await)
    }

    /// As [`SqliteStore::purge_expired`], blocking this thread.
    ///
    /// # Errors
    /// [`StoreError`] when SQLite fails.
    pub fn purge_sync(&self, batch: u64) -> Result<PurgeCounts, StoreError> {
        purge_result(self.submit_sync(Work::Purge(batch)))
    }

    /// Reads the table (readiness: the file opens and answers).
    ///
    /// # Errors
    /// [`StoreError`] when SQLite fails.
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self.submit(Work::Ping).await? {
            Answer::Pong => Ok(()),
            other => Err(mismatch(&other)),
        }
    }
}

fn mismatch(a: &Answer) -> StoreError {
    StoreError::Worker(format!(
        "the SQLite writer answered {a:?} to another request"
    ))
}

fn op_result(r: Reply) -> Result<StoreResult, StoreError> {
    match r? {
        Answer::Op(r) => Ok(r),
        other => Err(mismatch(&other)),
    }
}

fn purge_result(r: Reply) -> Result<PurgeCounts, StoreError> {
    match r? {
        Answer::Purged(c) => Ok(c),
        other => Err(mismatch(&other)),
    }
}

/// Runs one transaction-control statement (`BEGIN IMMEDIATE`, `COMMIT`, `ROLLBACK`) from the
/// connection's statement cache: `execute_batch` would parse it again on every call.
fn control(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Runs `f` in `BEGIN IMMEDIATE … COMMIT` (rolled back on error).
fn immediate<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    control(conn, "BEGIN IMMEDIATE")?;
    match f(conn) {
        Ok(v) => match control(conn, "COMMIT") {
            Ok(()) => Ok(v),
            Err(e) => {
                let _ = control(conn, "ROLLBACK");
                Err(e.into())
            }
        },
        Err(e) => {
            let _ = control(conn, "ROLLBACK");
            Err(e)
        }
    }
}

/// The thread that owns the connection.
struct Writer {
    conn: Connection,
    clock: Clock,
    stats: Arc<BatchStats>,
}

impl Writer {
    fn run(self, jobs: &mpsc::Receiver<Job>) {
        let session = Session {
            conn: &self.conn,
            clock: &self.clock,
            stats: &self.stats,
            stmts: std::array::from_fn(|_| RefCell::new(None)),
        };
        // Ends when every sender (every clone of the store) is gone.
        while let Ok(first) = jobs.recv() {
            let mut batch = Vec::with_capacity(8);
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match jobs.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            session.batch(batch);
        }
    }
}

/// What runs in the connection's transaction control and primitives: each statement is
/// prepared on its first use and kept for the writer's life. (rusqlite's own cache hashes a
/// statement's whole text on every use, twice: a recipe is several hundred bytes.)
#[derive(Clone, Copy)]
enum Sql {
    Begin,
    Commit,
    Rollback,
    Savepoint,
    RollbackTo,
    ReleaseSavepoint,
    Ping,
    Claim,
    Get,
    TakeOver,
    MarkUnknown,
    Complete,
    Release,
    Renew,
    Purge,
}

const SQL_COUNT: usize = Sql::Purge as usize + 1;

impl Sql {
    fn text(self) -> &'static str {
        match self {
            Self::Begin => "BEGIN IMMEDIATE",
            Self::Commit => "COMMIT",
            Self::Rollback => "ROLLBACK",
            Self::Savepoint => "SAVEPOINT idempo_op",
            Self::RollbackTo => "ROLLBACK TO idempo_op",
            Self::ReleaseSavepoint => "RELEASE idempo_op",
            Self::Ping => "SELECT 1 FROM idempo_record LIMIT 1",
            Self::Claim => recipes::SQLITE_CLAIM,
            Self::Get => recipes::SQLITE_GET,
            Self::TakeOver => recipes::SQLITE_TAKEOVER,
            Self::MarkUnknown => recipes::SQLITE_MARK_UNKNOWN,
            Self::Complete => recipes::SQLITE_COMPLETE,
            Self::Release => recipes::SQLITE_RELEASE,
            Self::Renew => recipes::SQLITE_RENEW,
            Self::Purge => recipes::SQLITE_PURGE,
        }
    }
}

/// The writer's connection with its prepared statements, for one run of the writer thread.
struct Session<'c> {
    conn: &'c Connection,
    clock: &'c Clock,
    stats: &'c BatchStats,
    stmts: [RefCell<Option<Statement<'c>>>; SQL_COUNT],
}

impl<'c> Session<'c> {
    /// Runs `f` on the statement for `sql`, prepared on its first use. Never called for the
    /// statement it is already running (each primitive's helpers use other statements).
    fn with<T>(
        &self,
        sql: Sql,
        f: impl FnOnce(&mut Statement<'c>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Some(cell) = self.stmts.get(sql as usize) else {
            return Err(StoreError::Worker("no such statement".to_owned()));
        };
        let mut slot = cell
            .try_borrow_mut()
            .map_err(|_| StoreError::Worker("a statement ran within itself".to_owned()))?;
        let stmt = match &mut *slot {
            Some(stmt) => stmt,
            empty => empty.insert(self.conn.prepare(sql.text())?),
        };
        f(stmt)
    }

    /// A statement without parameters or rows (transaction control).
    fn control(&self, sql: Sql) -> Result<(), StoreError> {
        self.with(sql, |stmt| Ok(stmt.raw_execute().map(|_| ())?))
    }

    fn query(&self, sql: Sql, params: &Params) -> Result<Vec<Vec<Value>>, StoreError> {
        self.with(sql, |stmt| {
            bind(stmt, params)?;
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
        })
    }

    fn execute(&self, sql: Sql, params: &Params) -> Result<usize, StoreError> {
        self.with(sql, |stmt| {
            bind(stmt, params)?;
            Ok(stmt.raw_execute()?)
        })
    }

    /// Primitive 2: the record (if any) and the store's now.
    fn get(&self, scope: &[u8], now: &Value) -> Result<(Option<Record>, u64), StoreError> {
        let rows = self.query(
            Sql::Get,
            &vec![(":scope", blob(scope)), (":now", now.clone())],
        )?;
        record_of(&rows)
    }

    fn now(&self) -> Value {
        self.clock.override_ms().map(int).unwrap_or(Value::Null)
    }

    /// Runs one batch: the reads first (committed state, no transaction), then the writes in one
    /// transaction, a savepoint each (none for a write alone); answers the writes after
    /// `COMMIT`.
    fn batch(&self, batch: Vec<Job>) {
        let mut writes = Vec::with_capacity(batch.len());
        for job in batch {
            if job.is_read() {
                let reply = self.read(&job.work);
                job.waiter.answer(reply);
            } else {
                writes.push(job);
            }
        }
        if writes.is_empty() {
            return;
        }
        self.stats.record(writes.len());
        if let Err(e) = self.control(Sql::Begin) {
            let msg = sqlite_message(&e);
            let mut first = Some(e);
            for job in writes {
                let err = match first.take() {
                    Some(e) => e,
                    None => StoreError::SqliteBatch(msg.clone()),
                };
                job.waiter.answer(Err(err));
            }
            return;
        }
        let mut done: Vec<(Waiter, Reply)> = Vec::with_capacity(writes.len());
        let mut lost: Option<String> = None;
        // A write alone in its transaction needs no savepoint: when it fails, the whole
        // transaction is rolled back below.
        let alone = writes.len() == 1;
        for job in writes {
            if alone {
                let reply = self.write(&job.work);
                if reply.is_err() {
                    if !self.conn.is_autocommit() {
                        let _ = self.control(Sql::Rollback);
                    }
                    job.waiter.answer(reply);
                    return;
                }
                done.push((job.waiter, reply));
                continue;
            }
            if let Some(msg) = &lost {
                // The transaction is gone (SQLite rolled it back after an I/O or full-disk
                // error): nothing more runs in it.
                done.push((job.waiter, Err(StoreError::SqliteBatch(msg.clone()))));
                continue;
            }
            let reply = self.savepoint(&job.work);
            if reply.is_err() && self.conn.is_autocommit() {
                lost = Some(match &reply {
                    Err(e) => format!("the transaction was rolled back after: {e}"),
                    Ok(_) => String::new(),
                });
            }
            done.push((job.waiter, reply));
        }
        let failure = match &lost {
            Some(msg) => Some(msg.clone()),
            None => match self.control(Sql::Commit) {
                Ok(()) => None,
                Err(e) => {
                    let _ = self.control(Sql::Rollback);
                    Some(sqlite_message(&e))
                }
            },
        };
        for (waiter, reply) in done {
            let reply = match (&failure, reply) {
                // A primitive that failed keeps its own error; the others did not take effect.
                (Some(_), Err(e)) => Err(e),
                (Some(msg), Ok(_)) => Err(StoreError::SqliteBatch(msg.clone())),
                (None, reply) => reply,
            };
            waiter.answer(reply);
        }
    }

    /// One write inside `SAVEPOINT … RELEASE`, rolled back to the savepoint on error.
    fn savepoint(&self, work: &Work) -> Reply {
        let c = self.conn;
        self.control(Sql::Savepoint)?;
        let reply = self.write(work);
        if reply.is_err() && !c.is_autocommit() {
            self.control(Sql::RollbackTo)?;
        }
        if !c.is_autocommit() {
            self.control(Sql::ReleaseSavepoint)?;
        }
        reply
    }

    fn read(&self, work: &Work) -> Reply {
        match work {
            Work::Op(StoreOp::Get { scope }) => {
                let (record, now_ms) = self.get(scope.as_bytes(), &self.now())?;
                Ok(Answer::Op(StoreResult::Got { record, now_ms }))
            }
            Work::Op(StoreOp::Commit { .. }) => Err(StoreError::Unsupported("COMMIT")),
            Work::Ping => {
                self.query(Sql::Ping, &Vec::new())?;
                Ok(Answer::Pong)
            }
            Work::Op(_) | Work::Purge(_) => self.write(work),
        }
    }

    fn write(&self, work: &Work) -> Reply {
        match work {
            Work::Op(op) => Ok(Answer::Op(self.op(op)?)),
            Work::Purge(batch) => Ok(Answer::Purged(self.purge(*batch)?)),
            Work::Ping => Ok(Answer::Pong),
        }
    }

    fn purge(&self, batch: u64) -> Result<PurgeCounts, StoreError> {
        let rows = self.query(
            Sql::Purge,
            &vec![(":batch", int(batch)), (":now", self.now())],
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
    }

    /// One primitive on the connection (a write runs inside the caller's transaction).
    fn op(&self, op: &StoreOp) -> Result<StoreResult, StoreError> {
        let now = self.now();
        match op {
            StoreOp::Claim {
                scope,
                fingerprint,
                token,
                lease_ms,
                ttl_ms,
            } => {
                let params: Params = vec![
                    (":scope", blob(scope.as_bytes())),
                    (":fp", Value::Text(fingerprint.as_str().to_owned())),
                    (":token", blob(token.as_bytes())),
                    (":lease", int(*lease_ms)),
                    (":ttl", int(*ttl_ms)),
                    (":now", now.clone()),
                ];
                for _ in 0..CLAIM_ATTEMPTS {
                    let rows = self.query(Sql::Claim, &params)?;
                    if let Some(row) = rows.first() {
                        return Ok(StoreResult::Claimed {
                            generation: u32_at(row, 0)?,
                            now_ms: u64_at(row, 1)?,
                        });
                    }
                    let (record, now_ms) = self.get(scope.as_bytes(), &now)?;
                    if let Some(record) = record {
                        if !record.is_expired(now_ms) {
                            return Ok(StoreResult::Existing { record, now_ms });
                        }
                    }
                }
                Err(StoreError::Contention(CLAIM_ATTEMPTS))
            }
            StoreOp::Get { scope } => {
                let (record, now_ms) = self.get(scope.as_bytes(), &now)?;
                Ok(StoreResult::Got { record, now_ms })
            }
            StoreOp::TakeOver {
                scope,
                seen_token,
                new_token,
                lease_ms,
            } => {
                let rows = self.query(
                    Sql::TakeOver,
                    &vec![
                        (":scope", blob(scope.as_bytes())),
                        (":seen", blob(seen_token.as_bytes())),
                        (":new", blob(new_token.as_bytes())),
                        (":lease", int(*lease_ms)),
                        (":now", now),
                    ],
                )?;
                Ok(StoreResult::TookOver(match rows.first() {
                    Some(row) => Some(u32_at(row, 0)?),
                    None => None,
                }))
            }
            StoreOp::MarkUnknown {
                scope,
                seen_token,
                ttl_ms,
            } => {
                let n = self.execute(
                    Sql::MarkUnknown,
                    &vec![
                        (":scope", blob(scope.as_bytes())),
                        (":seen", blob(seen_token.as_bytes())),
                        (":ttl", int(*ttl_ms)),
                        (":now", now),
                    ],
                )?;
                Ok(StoreResult::MarkedUnknown(n == 1))
            }
            StoreOp::Complete {
                scope,
                token,
                response,
                ttl_ms,
            } => {
                let n = self.execute(
                    Sql::Complete,
                    &vec![
                        (":scope", blob(scope.as_bytes())),
                        (":token", blob(token.as_bytes())),
                        (":response", blob(response)),
                        (":ttl", int(*ttl_ms)),
                        (":now", now),
                    ],
                )?;
                Ok(StoreResult::Completed(n == 1))
            }
            StoreOp::Release { scope, token } => {
                let n = self.execute(
                    Sql::Release,
                    &vec![
                        (":scope", blob(scope.as_bytes())),
                        (":token", blob(token.as_bytes())),
                    ],
                )?;
                Ok(StoreResult::Released(n == 1))
            }
            StoreOp::Renew {
                scope,
                token,
                lease_ms,
            } => {
                let n = self.execute(
                    Sql::Renew,
                    &vec![
                        (":scope", blob(scope.as_bytes())),
                        (":token", blob(token.as_bytes())),
                        (":lease", int(*lease_ms)),
                        (":now", now),
                    ],
                )?;
                Ok(StoreResult::Renewed(n == 1))
            }
            StoreOp::Commit { .. } => Err(StoreError::Unsupported("COMMIT")),
        }
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// SQLite's own message for an error (without [`StoreError::Sqlite`]'s prefix: a batch error
/// adds its own).
fn sqlite_message(e: &StoreError) -> String {
    match e {
        StoreError::Sqlite(inner) => inner.to_string(),
        other => other.to_string(),
    }
}

/// Binds `params` by name (a name the statement does not use is skipped).
fn bind(stmt: &mut Statement<'_>, params: &Params) -> Result<(), StoreError> {
    for (name, value) in params {
        if let Some(i) = stmt.parameter_index(name)? {
            stmt.raw_bind_parameter(i, value)?;
        }
    }
    Ok(())
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

/// Primitive 2's row: the record (if any) and the store's now.
fn record_of(rows: &[Vec<Value>]) -> Result<(Option<Record>, u64), StoreError> {
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
