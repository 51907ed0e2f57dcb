//! The shipped PostgreSQL recipes under concurrency: histories of several clients against a real
//! server, each checked for linearizability against core's primitives (`idempo_tests::linearize`,
//! `spec/MODEL.md` §5.4).
//!
//! Needs `IDEMPO_TEST_PG_DSN` (and, for the same checks through a transaction-pooling PgBouncer,
//! `IDEMPO_TEST_PGBOUNCER_DSN`), as `scripts/test-services.sh start` prints them; `make
//! test-recipes-pg` starts the servers and runs it. Without them each test prints a notice and
//! passes. Each run works in a schema of its own (`idempo_lin_<pid>_<n>`), dropped at the end.
//!
//! Every recipe runs as one unnamed extended-protocol statement with typed parameters (one round
//! trip, no prepared-statement state), as the bindings run them, so it works behind PgBouncer.
//! The `now` override is a logical clock shared by the clients: an operation's `now` is the
//! clock's value when it was invoked, so leases expire, records are taken over and purged within
//! one history.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};

use idempo_core::machine::StoreOp;
use idempo_core::machine::store::ClaimOutcome;
use idempo_core::recipes;
use idempo_core::record::{
    FencingToken, FingerprintText, Record, RecordRow, RecordState, StoredResponse,
};
use idempo_core::scope::ScopeId;
use idempo_tests::linearize::{Call, Entry, Verdict, check};
use idempo_tests::recipes::Applied;
use postgres::types::{ToSql, Type};
use postgres::{Client, NoTls, Row};

const SCOPE: [u8; 32] = [9; 32];
/// Logical time 0 in unix ms.
const BASE_MS: u64 = 1_700_000_000_000;
const CLIENTS: usize = 4;

/// One planted mistake in a recipe, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mutant {
    /// The shipped recipes.
    None,
    /// Claim as check-then-write: `get`, then an unconditional upsert when the record read was
    /// absent or expired (the classic double execution).
    ClaimCheckThenWrite,
    /// Takeover as check-then-write: `get`, then an update by key alone when the read record
    /// held the seen token with an expired lease.
    TakeoverCheckThenWrite,
}

/// The shipped recipe texts with the table renamed into this run's schema.
struct Texts {
    schema: String,
    claim: String,
    get: String,
    takeover: String,
    mark_unknown: String,
    complete: String,
    release: String,
    renew: String,
    purge: String,
    table: String,
}

impl Texts {
    fn new(schema: &str) -> Self {
        let table = format!("{schema}.idempo_record");
        let r = |sql: &str| recipes::rename_table(sql, &table);
        Self {
            schema: schema.to_owned(),
            claim: r(recipes::POSTGRES_CLAIM),
            get: r(recipes::POSTGRES_GET),
            takeover: r(recipes::POSTGRES_TAKEOVER),
            mark_unknown: r(recipes::POSTGRES_MARK_UNKNOWN),
            complete: r(recipes::POSTGRES_COMPLETE),
            release: r(recipes::POSTGRES_RELEASE),
            renew: r(recipes::POSTGRES_RENEW),
            purge: r(recipes::POSTGRES_PURGE),
            table,
        }
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn int(v: u64) -> Result<i64, String> {
    i64::try_from(v).map_err(err)
}

/// The record columns of a claim's or a get's row, starting at column `from`.
fn record_at(row: &Row, from: usize) -> Result<Option<Record>, String> {
    let fingerprint: Option<String> = row.try_get(from).map_err(err)?;
    let Some(fingerprint) = fingerprint else {
        return Ok(None);
    };
    let state: i16 = row.try_get(from + 1).map_err(err)?;
    let generation: i32 = row.try_get(from + 3).map_err(err)?;
    Record::from_row(RecordRow {
        fingerprint,
        state: i64::from(state),
        token: row.try_get(from + 2).map_err(err)?,
        generation: i64::from(generation),
        lease_until_ms: row.try_get(from + 4).map_err(err)?,
        expires_at_ms: row.try_get(from + 5).map_err(err)?,
        response: row.try_get(from + 6).map_err(err)?,
    })
    .map(Some)
    .map_err(err)
}

/// One client's connection running the recipes.
struct Pg<'t> {
    db: Client,
    texts: &'t Texts,
    mutant: Mutant,
}

impl Pg<'_> {
    fn rows(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, String> {
        self.db.query_typed(sql, params).map_err(err)
    }

    fn count(&mut self, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> Result<bool, String> {
        match self.db.execute_typed(sql, params).map_err(err)? {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(format!("{n} rows changed for one key")),
        }
    }

    fn get(&mut self, now: i64) -> Result<Option<Record>, String> {
        let t = self.texts;
        let rows = self.rows(&t.get, &[(&&SCOPE[..], Type::BYTEA), (&now, Type::INT8)])?;
        match rows.as_slice() {
            [row] => record_at(row, 0),
            _ => Err(format!("get returned {} rows", rows.len())),
        }
    }

    fn claim(
        &mut self,
        fp: &str,
        token: &[u8],
        lease: i64,
        ttl: i64,
        now: i64,
    ) -> Result<Applied, String> {
        // The shipped claim's parameters; the check-then-write mutant takes the same.
        let params: [(&(dyn ToSql + Sync), Type); 6] = [
            (&&SCOPE[..], Type::BYTEA),
            (&fp, Type::TEXT),
            (&token, Type::BYTEA),
            (&lease, Type::INT8),
            (&ttl, Type::INT8),
            (&now, Type::INT8),
        ];
        if self.mutant == Mutant::ClaimCheckThenWrite {
            if let Some(r) = self.get(now)? {
                if !r.is_expired(u64::try_from(now).map_err(err)?) {
                    return Ok(Applied::Claim(ClaimOutcome::Existing(r)));
                }
            }
            let sql = format!(
                "INSERT INTO {t} AS r (scope_key, fingerprint, state, token, generation, lease_until, expires_at, response)
                 VALUES ($1::bytea, $2::text, 1, $3::bytea, 1, $6::bigint + $4::bigint, $6::bigint + greatest($5::bigint, $4::bigint), NULL)
                 ON CONFLICT (scope_key) DO UPDATE
                    SET fingerprint = EXCLUDED.fingerprint, state = 1, token = EXCLUDED.token,
                        generation = least(r.generation + 1, 2147483647),
                        lease_until = EXCLUDED.lease_until, expires_at = EXCLUDED.expires_at, response = NULL
                 RETURNING generation",
                t = self.texts.table
            );
            let rows = self.rows(&sql, &params)?;
            let generation: i32 = rows
                .first()
                .ok_or("upsert returned no row")?
                .try_get(0)
                .map_err(err)?;
            return Ok(Applied::Claim(ClaimOutcome::Claimed {
                generation: u32::try_from(generation).map_err(err)?,
            }));
        }
        let t = self.texts;
        // Zero rows: the conflicting row is not in the statement's snapshot; run it again
        // (spec/STORAGE.md §4.3), as every host does.
        for _ in 0..50 {
            let rows = self.rows(&t.claim, &params)?;
            let Some(row) = rows.first() else { continue };
            if rows.len() > 1 {
                return Err(format!("claim returned {} rows", rows.len()));
            }
            let claimed: bool = row.try_get(0).map_err(err)?;
            if claimed {
                let generation: i32 = row.try_get(4).map_err(err)?;
                let at: i64 = row.try_get(8).map_err(err)?;
                if at != now {
                    return Err(format!("claim returned now_ms {at}, expected {now}"));
                }
                return Ok(Applied::Claim(ClaimOutcome::Claimed {
                    generation: u32::try_from(generation).map_err(err)?,
                }));
            }
            return match record_at(row, 1)? {
                Some(r) => Ok(Applied::Claim(ClaimOutcome::Existing(r))),
                None => Err("claim found a live record without columns".into()),
            };
        }
        Err("claim returned zero rows 50 times in a row".into())
    }

    fn takeover(
        &mut self,
        seen: &[u8],
        new: &[u8],
        lease: i64,
        now: i64,
    ) -> Result<Applied, String> {
        let rows = if self.mutant == Mutant::TakeoverCheckThenWrite {
            let now_u = u64::try_from(now).map_err(err)?;
            let due = self.get(now)?.is_some_and(|r| {
                r.token.0[..] == *seen
                    && matches!(r.state, RecordState::InProgress { lease_until_ms } if lease_until_ms <= now_u)
            });
            if !due {
                return Ok(Applied::TakeOver(None));
            }
            let sql = format!(
                "UPDATE {t} SET token = $2::bytea, lease_until = $4::bigint + $3::bigint,
                        expires_at = greatest(expires_at, $4::bigint + $3::bigint)
                  WHERE scope_key = $1::bytea RETURNING generation",
                t = self.texts.table
            );
            self.rows(
                &sql,
                &[
                    (&&SCOPE[..], Type::BYTEA),
                    (&new, Type::BYTEA),
                    (&lease, Type::INT8),
                    (&now, Type::INT8),
                ],
            )?
        } else {
            let t = self.texts;
            self.rows(
                &t.takeover,
                &[
                    (&&SCOPE[..], Type::BYTEA),
                    (&seen, Type::BYTEA),
                    (&new, Type::BYTEA),
                    (&lease, Type::INT8),
                    (&now, Type::INT8),
                ],
            )?
        };
        match rows.as_slice() {
            [] => Ok(Applied::TakeOver(None)),
            [row] => {
                let g: i32 = row.try_get(0).map_err(err)?;
                Ok(Applied::TakeOver(Some(u32::try_from(g).map_err(err)?)))
            }
            more => Err(format!("takeover returned {} rows", more.len())),
        }
    }

    fn purge(&mut self, now: i64) -> Result<Applied, String> {
        let t = self.texts;
        let batch: i64 = 100;
        let rows = self.rows(&t.purge, &[(&batch, Type::INT8), (&now, Type::INT8)])?;
        let row = rows.first().ok_or("purge returned no row")?;
        let counts: [i64; 3] = [
            row.try_get(0).map_err(err)?,
            row.try_get(1).map_err(err)?,
            row.try_get(2).map_err(err)?,
        ];
        match counts {
            [0, 0, 0] => Ok(Applied::Purge(None)),
            [1, 0, 0] => Ok(Applied::Purge(Some(1))),
            [0, 1, 0] => Ok(Applied::Purge(Some(2))),
            [0, 0, 1] => Ok(Applied::Purge(Some(3))),
            other => Err(format!("purge of one key deleted {other:?}")),
        }
    }

    /// A conditional write of the shape (`scope_key`, token, milliseconds, now): mark_unknown and
    /// renew.
    fn fenced(
        &mut self,
        sql: &str,
        token: &FencingToken,
        ms: i64,
        now: i64,
    ) -> Result<Applied, String> {
        let token: &[u8] = &token.0;
        let params: [(&(dyn ToSql + Sync), Type); 4] = [
            (&&SCOPE[..], Type::BYTEA),
            (&token, Type::BYTEA),
            (&ms, Type::INT8),
            (&now, Type::INT8),
        ];
        Ok(Applied::Applied(self.count(sql, &params)?))
    }

    /// Runs `call` at `now_ms`: the store's answer in core's terms.
    fn run(&mut self, call: &Call, now_ms: u64) -> Result<Applied, String> {
        let now = int(now_ms)?;
        let t = self.texts;
        match call {
            Call::Purge => self.purge(now),
            Call::Op(op) => match op {
                StoreOp::Claim {
                    fingerprint,
                    token,
                    lease_ms,
                    ttl_ms,
                    ..
                } => self.claim(
                    fingerprint.as_str(),
                    &token.0,
                    int(*lease_ms)?,
                    int(*ttl_ms)?,
                    now,
                ),
                StoreOp::Get { .. } => Ok(Applied::Get(self.get(now)?)),
                StoreOp::TakeOver {
                    seen_token,
                    new_token,
                    lease_ms,
                    ..
                } => self.takeover(&seen_token.0, &new_token.0, int(*lease_ms)?, now),
                StoreOp::MarkUnknown {
                    seen_token, ttl_ms, ..
                } => self.fenced(&t.mark_unknown, seen_token, int(*ttl_ms)?, now),
                StoreOp::Complete {
                    token,
                    response,
                    ttl_ms,
                    ..
                } => {
                    let ttl = int(*ttl_ms)?;
                    Ok(Applied::Applied(self.count(
                        &t.complete,
                        &[
                            (&&SCOPE[..], Type::BYTEA),
                            (&&token.0[..], Type::BYTEA),
                            (&response.as_slice(), Type::BYTEA),
                            (&ttl, Type::INT8),
                            (&now, Type::INT8),
                        ],
                    )?))
                }
                StoreOp::Release { token, .. } => Ok(Applied::Applied(self.count(
                    &t.release,
                    &[(&&SCOPE[..], Type::BYTEA), (&&token.0[..], Type::BYTEA)],
                )?)),
                StoreOp::Renew {
                    token, lease_ms, ..
                } => self.fenced(&t.renew, token, int(*lease_ms)?, now),
                StoreOp::Commit { .. } => Err("COMMIT is not a recipe".into()),
            },
        }
    }
}

/// A small deterministic generator (splitmix64): the workload's choices, not its interleaving.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What one client of a round does.
#[derive(Clone, Copy, Debug)]
enum Workload {
    /// Every primitive, chosen at random over one key, with tokens the client holds or has seen
    /// (leases of 12 ticks, retention of 40, so records expire, are taken over and purged).
    Mixed { ops: usize },
    /// Every client claims the key at once, then completes what it won.
    ClaimStorm,
    /// The key is in progress with an expired lease; every client takes it over at once with the
    /// token it holds.
    TakeoverStorm,
}

const LEASE: u64 = 12;
const TTL: u64 = 40;

fn fp(which: u64) -> FingerprintText {
    FingerprintText::new(if which == 0 { "fp-a" } else { "fp-b" }).unwrap_or_else(|e| panic!("{e}"))
}

fn scope() -> ScopeId {
    ScopeId::from_bytes(SCOPE)
}

fn response(client: usize) -> Vec<u8> {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: format!("{{\"by\":{client}}}").into_bytes(),
    }
    .encode()
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A client's next call in a mixed workload.
fn mixed_call(rng: &mut Rng, client: usize, fresh: FencingToken, held: &[FencingToken]) -> Call {
    let pick = |rng: &mut Rng| -> FencingToken {
        if held.is_empty() {
            fresh
        } else {
            // Mostly the newest token seen, sometimes an older one (a paused owner).
            let n = held.len() as u64;
            let back = if rng.below(4) == 0 { rng.below(n) } else { 0 };
            held[(n - 1 - back) as usize]
        }
    };
    let roll = rng.below(100);
    Call::Op(match roll {
        0..=27 => StoreOp::Claim {
            scope: scope(),
            fingerprint: fp(rng.below(5) / 4),
            token: fresh,
            lease_ms: LEASE,
            ttl_ms: TTL,
        },
        28..=35 => StoreOp::Get { scope: scope() },
        36..=47 => StoreOp::TakeOver {
            scope: scope(),
            seen_token: pick(rng),
            new_token: fresh,
            lease_ms: LEASE,
        },
        48..=55 => StoreOp::MarkUnknown {
            scope: scope(),
            seen_token: pick(rng),
            ttl_ms: TTL,
        },
        56..=71 => StoreOp::Complete {
            scope: scope(),
            token: pick(rng),
            response: response(client),
            ttl_ms: TTL,
        },
        72..=79 => StoreOp::Release {
            scope: scope(),
            token: pick(rng),
        },
        80..=94 => StoreOp::Renew {
            scope: scope(),
            token: pick(rng),
            lease_ms: if rng.below(4) == 0 { 0 } else { LEASE },
        },
        _ => return Call::Purge,
    })
}

/// Tokens a step reveals: the one it wrote, and the one of any record it read.
fn learn(call: &Call, answer: &Applied, held: &mut Vec<FencingToken>) {
    let mut add = |t: FencingToken| {
        if held.last() != Some(&t) {
            held.retain(|h| *h != t);
            held.push(t);
        }
    };
    match (call, answer) {
        (Call::Op(StoreOp::Claim { token, .. }), Applied::Claim(ClaimOutcome::Claimed { .. })) => {
            add(*token)
        }
        (Call::Op(StoreOp::TakeOver { new_token, .. }), Applied::TakeOver(Some(_))) => {
            add(*new_token)
        }
        (_, Applied::Claim(ClaimOutcome::Existing(r)) | Applied::Get(Some(r))) => add(r.token),
        _ => {}
    }
}

/// A unique token per (round, client, step).
fn token(round: u64, client: usize, step: u64) -> FencingToken {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&round.to_be_bytes());
    t[8] = u8::try_from(client).unwrap_or(u8::MAX);
    t[9..].copy_from_slice(&step.to_be_bytes()[1..]);
    FencingToken(t)
}

/// The server this run uses, or `None` after a notice.
fn dsn(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            eprintln!("notice: {var} is not set; skipping (make test-recipes-pg starts a server)");
            None
        }
    }
}

/// A schema of this run's own, dropped when it goes out of scope.
struct Schema {
    dsn: String,
    texts: Texts,
}

impl Schema {
    fn create(dsn: &str, tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "idempo_lin_{}_{}_{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let texts = Texts::new(&name);
        let mut db = Client::connect(dsn, NoTls).unwrap_or_else(|e| panic!("connect {dsn}: {e}"));
        db.batch_execute(&format!(
            "CREATE SCHEMA {name}; {}",
            recipes::rename_table(recipes::POSTGRES_SCHEMA, &texts.table)
        ))
        .unwrap_or_else(|e| panic!("schema: {e}"));
        Self {
            dsn: dsn.to_owned(),
            texts,
        }
    }

    fn clients(&self, mutant: Mutant) -> Vec<Pg<'_>> {
        (0..CLIENTS)
            .map(|_| Pg {
                db: Client::connect(&self.dsn, NoTls).unwrap_or_else(|e| panic!("connect: {e}")),
                texts: &self.texts,
                mutant,
            })
            .collect()
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        if let Ok(mut db) = Client::connect(&self.dsn, NoTls) {
            let _ = db.batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {} CASCADE",
                self.texts.schema
            ));
        }
    }
}

/// Runs one round of `workload` with `clients` on an empty table; returns the history.
fn round(clients: &mut [Pg<'_>], workload: Workload, round: u64) -> Vec<Entry> {
    let clock = AtomicU64::new(1);
    let history = Mutex::new(Vec::new());
    let table = clients[0].texts.table.clone();
    clients[0]
        .db
        .batch_execute(&format!("DELETE FROM {table}"))
        .unwrap_or_else(|e| panic!("reset: {e}"));
    // The takeover storm starts from a record in progress whose lease has run out, written by
    // core's claim with the token every client holds.
    let owner = token(round, CLIENTS, 0);
    if let Workload::TakeoverStorm = workload {
        let call = Call::Op(StoreOp::Claim {
            scope: scope(),
            fingerprint: fp(0),
            token: owner,
            lease_ms: 1,
            ttl_ms: 10_000,
        });
        let answer = clients[0]
            .run(&call, BASE_MS)
            .unwrap_or_else(|e| panic!("{e}"));
        history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Entry {
                client: CLIENTS,
                call,
                now_ms: BASE_MS,
                answer,
                invoked: 0,
                returned: clock.fetch_add(1, Ordering::SeqCst),
            });
    }
    let start = Barrier::new(clients.len());
    std::thread::scope(|s| {
        for (id, pg) in clients.iter_mut().enumerate() {
            let (clock, history, start) = (&clock, &history, &start);
            s.spawn(move || {
                let mut rng = Rng(round.wrapping_mul(1_000_003) ^ (id as u64) << 48);
                let mut held: Vec<FencingToken> = Vec::new();
                let mut mine = Vec::new();
                let mut step = |call: Call, held: &mut Vec<FencingToken>| -> Applied {
                    let invoked = clock.fetch_add(1, Ordering::SeqCst);
                    let now_ms = BASE_MS + invoked;
                    let answer = pg
                        .run(&call, now_ms)
                        .unwrap_or_else(|e| panic!("client {id}: {call:?}: {e}"));
                    let returned = clock.fetch_add(1, Ordering::SeqCst);
                    learn(&call, &answer, held);
                    mine.push(Entry {
                        client: id,
                        call,
                        now_ms,
                        answer: answer.clone(),
                        invoked,
                        returned,
                    });
                    answer
                };
                start.wait();
                match workload {
                    Workload::Mixed { ops } => {
                        for n in 0..ops as u64 {
                            let call = mixed_call(&mut rng, id, token(round, id, n + 1), &held);
                            step(call, &mut held);
                        }
                    }
                    Workload::ClaimStorm => {
                        let t = token(round, id, 1);
                        let call = Call::Op(StoreOp::Claim {
                            scope: scope(),
                            fingerprint: fp(0),
                            token: t,
                            lease_ms: 10_000,
                            ttl_ms: 10_000,
                        });
                        if let Applied::Claim(ClaimOutcome::Claimed { .. }) = step(call, &mut held)
                        {
                            let done = Call::Op(StoreOp::Complete {
                                scope: scope(),
                                token: t,
                                response: response(id),
                                ttl_ms: 10_000,
                            });
                            step(done, &mut held);
                        }
                    }
                    Workload::TakeoverStorm => {
                        let call = Call::Op(StoreOp::TakeOver {
                            scope: scope(),
                            seen_token: owner,
                            new_token: token(round, id, 1),
                            lease_ms: 10_000,
                        });
                        step(call, &mut held);
                    }
                }
                history
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(mine);
            });
        }
    });
    let mut h = history.into_inner().unwrap_or_else(|e| e.into_inner());
    h.sort_by_key(|e| e.invoked);
    h
}

/// Runs `rounds` rounds and checks each history; returns the number of violations and the
/// first one's account.
fn run_checked(
    dsn: &str,
    tag: &str,
    mutant: Mutant,
    workload: Workload,
    rounds: u64,
) -> (usize, Option<String>, usize) {
    let schema = Schema::create(dsn, tag);
    let mut clients = schema.clients(mutant);
    let (mut bad, mut first, mut ops) = (0, None, 0);
    let mut tally = std::collections::BTreeMap::<&str, (usize, usize)>::new();
    for r in 0..rounds {
        let h = round(&mut clients, workload, r + 1);
        ops += h.len();
        for e in &h {
            let t = tally.entry(e.call.name()).or_default();
            t.1 += 1;
            if applied(&e.answer) {
                t.0 += 1;
            }
        }
        match check(&h, None).unwrap_or_else(|e| panic!("{e}")) {
            Verdict::Linearizable(_) => {}
            Verdict::Violation(v) => {
                bad += 1;
                first.get_or_insert_with(|| v.explain(&h));
            }
        }
    }
    let tally: Vec<String> = tally
        .iter()
        .map(|(name, (hit, all))| format!("{name} {hit}/{all}"))
        .collect();
    eprintln!("  applied/run per primitive: {}", tally.join(", "));
    (bad, first, ops)
}

/// Whether an answer changed the record (or, for a get, found one): the workload's coverage.
fn applied(answer: &Applied) -> bool {
    match answer {
        Applied::Claim(c) => matches!(c, ClaimOutcome::Claimed { .. }),
        Applied::Get(r) => r.is_some(),
        Applied::TakeOver(g) => g.is_some(),
        Applied::Applied(a) => *a,
        Applied::Purge(p) => p.is_some(),
    }
}

fn rounds(default: u64) -> u64 {
    std::env::var("IDEMPO_LIN_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn shipped_recipes_are_linearizable(var: &str) {
    let Some(dsn) = dsn(var) else { return };
    for (name, workload, n) in [
        ("mixed", Workload::Mixed { ops: 30 }, rounds(40)),
        ("claim storm", Workload::ClaimStorm, rounds(40)),
        ("takeover storm", Workload::TakeoverStorm, rounds(40)),
    ] {
        let (bad, first, ops) = run_checked(&dsn, "shipped", Mutant::None, workload, n);
        eprintln!(
            "{var}: {name}: {n} histories of {CLIENTS} clients, {ops} operations, {bad} not linearizable"
        );
        assert_eq!(
            bad,
            0,
            "{name}: the shipped recipes gave a history core cannot explain:\n{}",
            first.unwrap_or_default()
        );
    }
}

#[test]
fn shipped_recipes_are_linearizable_on_postgres() {
    shipped_recipes_are_linearizable("IDEMPO_TEST_PG_DSN");
}

#[test]
fn shipped_recipes_are_linearizable_through_pgbouncer() {
    shipped_recipes_are_linearizable("IDEMPO_TEST_PGBOUNCER_DSN");
}

/// Each planted check-then-write mistake passes every single-client vector (it answers like the
/// recipe when run alone) but gives a history with no valid order once clients race.
#[test]
fn check_then_write_mistakes_are_caught() {
    let Some(dsn) = dsn("IDEMPO_TEST_PG_DSN") else {
        return;
    };
    for (mutant, workload) in [
        (Mutant::ClaimCheckThenWrite, Workload::ClaimStorm),
        (Mutant::TakeoverCheckThenWrite, Workload::TakeoverStorm),
    ] {
        // Rounds until the first violation (a race the barrier makes likely in the first few).
        let schema = Schema::create(&dsn, "mutant");
        let mut clients = schema.clients(mutant);
        let mut found = None;
        for r in 0..500 {
            let h = round(&mut clients, workload, r + 1);
            if let Verdict::Violation(v) = check(&h, None).unwrap_or_else(|e| panic!("{e}")) {
                found = Some((r + 1, v.explain(&h), h));
                break;
            }
        }
        let (after, account, h) =
            found.unwrap_or_else(|| panic!("{mutant:?}: no violation in 500 rounds"));
        eprintln!("{mutant:?}: caught after {after} round(s):\n{account}");
        // The violation is the race it plants: two clients won the same key.
        let winners = h
            .iter()
            .filter(|e| {
                e.client < CLIENTS
                    && matches!(
                        e.answer,
                        Applied::Claim(ClaimOutcome::Claimed { .. }) | Applied::TakeOver(Some(_))
                    )
            })
            .count();
        assert!(winners >= 2, "{mutant:?}: {winners} winner(s):\n{account}");
    }
}
