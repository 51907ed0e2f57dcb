//! The SQLite recipes (`spec/STORAGE.md` §7) on a real in-memory SQLite (rusqlite, bundled).
use idempo_core::machine::StoreOp;
use idempo_core::machine::store::ClaimOutcome;
use idempo_core::recipes;
use idempo_core::record::{Record, RecordRow};
use rusqlite::{Connection, OptionalExtension, ToSql, named_params};

use super::{Applied, Outcome, Step};

const SCOPE: [u8; 32] = [7; 32];

/// The recipe texts a [`SqliteRecipes`] runs: the shipped ones, or a mutation of one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteTexts {
    /// [`recipes::SQLITE_CLAIM`].
    pub claim: String,
    /// [`recipes::SQLITE_GET`].
    pub get: String,
    /// [`recipes::SQLITE_TAKEOVER`].
    pub takeover: String,
    /// [`recipes::SQLITE_MARK_UNKNOWN`].
    pub mark_unknown: String,
    /// [`recipes::SQLITE_COMPLETE`].
    pub complete: String,
    /// [`recipes::SQLITE_RELEASE`].
    pub release: String,
    /// [`recipes::SQLITE_RENEW`].
    pub renew: String,
    /// [`recipes::SQLITE_PURGE`].
    pub purge: String,
}

impl Default for SqliteTexts {
    fn default() -> Self {
        Self {
            claim: recipes::SQLITE_CLAIM.into(),
            get: recipes::SQLITE_GET.into(),
            takeover: recipes::SQLITE_TAKEOVER.into(),
            mark_unknown: recipes::SQLITE_MARK_UNKNOWN.into(),
            complete: recipes::SQLITE_COMPLETE.into(),
            release: recipes::SQLITE_RELEASE.into(),
            renew: recipes::SQLITE_RENEW.into(),
            purge: recipes::SQLITE_PURGE.into(),
        }
    }
}

/// One SQLite database holding one slot of the model at a time.
pub struct SqliteRecipes {
    db: Connection,
    texts: SqliteTexts,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl SqliteRecipes {
    /// A fresh in-memory database with the shipped schema.
    ///
    /// # Errors
    /// When SQLite refuses the schema.
    pub fn new(texts: SqliteTexts) -> Result<Self, String> {
        let db = Connection::open_in_memory().map_err(err)?;
        db.execute_batch(recipes::SQLITE_SCHEMA).map_err(err)?;
        Ok(Self { db, texts })
    }

    /// The texts it runs.
    #[must_use]
    pub fn texts(&self) -> &SqliteTexts {
        &self.texts
    }

    fn load(&self, slot: &Option<Record>) -> Result<(), String> {
        self.db
            .execute("DELETE FROM idempo_record", [])
            .map_err(err)?;
        if let Some(r) = slot {
            let row = r.to_row().map_err(err)?;
            self.db
                .execute(
                    "INSERT INTO idempo_record (scope_key, fingerprint, state, token, generation, lease_until, expires_at, response)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    rusqlite::params![
                        &SCOPE[..],
                        row.fingerprint,
                        row.state,
                        row.token,
                        row.generation,
                        row.lease_until_ms,
                        row.expires_at_ms,
                        row.response
                    ],
                )
                .map_err(err)?;
        }
        Ok(())
    }

    /// Reads the slot back with the shipped `get` recipe.
    fn read(&self, now_ms: u64) -> Result<Option<Record>, String> {
        let now = i64::try_from(now_ms).map_err(err)?;
        let mut stmt = self.db.prepare(&self.texts.get).map_err(err)?;
        let row = stmt
            .query_row(named_params! {":scope": &SCOPE[..], ":now": now}, |r| {
                let fingerprint: Option<String> = r.get(0)?;
                let Some(fingerprint) = fingerprint else {
                    return Ok(None);
                };
                Ok(Some(RecordRow {
                    fingerprint,
                    state: r.get(1)?,
                    token: r.get(2)?,
                    generation: r.get(3)?,
                    lease_until_ms: r.get(4)?,
                    expires_at_ms: r.get(5)?,
                    response: r.get(6)?,
                }))
            })
            .map_err(err)?;
        row.map(|r| Record::from_row(r).map_err(err)).transpose()
    }

    fn changes(&self, sql: &str, params: &[(&str, &dyn ToSql)]) -> Result<bool, String> {
        let n = self.db.execute(sql, params).map_err(err)?;
        match n {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(format!("{n} rows changed for one key")),
        }
    }

    /// Runs `step` from `slot` at `now_ms`: its answer and the slot after it.
    ///
    /// # Errors
    /// SQLite errors, rows that do not form a record, `Commit`.
    pub fn step(
        &mut self,
        slot: &Option<Record>,
        step: Step<'_>,
        now_ms: u64,
    ) -> Result<Outcome, String> {
        self.load(slot)?;
        let now = i64::try_from(now_ms).map_err(err)?;
        let scope: &[u8] = &SCOPE;
        let applied = match step {
            Step::Purge => {
                let mut stmt = self.db.prepare(&self.texts.purge).map_err(err)?;
                let states: Vec<i64> = stmt
                    .query_map(named_params! {":batch": 10, ":now": now}, |r| r.get(0))
                    .map_err(err)?
                    .collect::<Result<_, _>>()
                    .map_err(err)?;
                match states.as_slice() {
                    [] => Applied::Purge(None),
                    [s] => Applied::Purge(Some(*s)),
                    more => return Err(format!("purge deleted {} rows of one key", more.len())),
                }
            }
            Step::Op(op) => match op {
                StoreOp::Claim {
                    fingerprint,
                    token,
                    lease_ms,
                    ttl_ms,
                    ..
                } => {
                    let lease = i64::try_from(*lease_ms).map_err(err)?;
                    let ttl = i64::try_from(*ttl_ms).map_err(err)?;
                    let mut stmt = self.db.prepare(&self.texts.claim).map_err(err)?;
                    let claimed: Option<(i64, i64)> = stmt
                        .query_row(
                            named_params! {
                                ":scope": scope, ":fp": fingerprint.as_str(), ":token": &token.0[..],
                                ":lease": lease, ":ttl": ttl, ":now": now,
                            },
                            |r| Ok((r.get(0)?, r.get(1)?)),
                        )
                        .optional()
                        .map_err(err)?;
                    match claimed {
                        Some((generation, at)) => {
                            if at != now {
                                return Err(format!("claim returned now_ms {at}, expected {now}"));
                            }
                            Applied::Claim(ClaimOutcome::Claimed {
                                generation: u32::try_from(generation).map_err(err)?,
                            })
                        }
                        None => match self.read(now_ms)? {
                            Some(r) => Applied::Claim(ClaimOutcome::Existing(r)),
                            None => return Err("claim applied nothing and left no record".into()),
                        },
                    }
                }
                StoreOp::Get { .. } => Applied::Get(self.read(now_ms)?),
                StoreOp::TakeOver {
                    seen_token,
                    new_token,
                    lease_ms,
                    ..
                } => {
                    let lease = i64::try_from(*lease_ms).map_err(err)?;
                    let mut stmt = self.db.prepare(&self.texts.takeover).map_err(err)?;
                    let g: Option<i64> = stmt
                        .query_row(
                            named_params! {
                                ":scope": scope, ":seen": &seen_token.0[..], ":new": &new_token.0[..],
                                ":lease": lease, ":now": now,
                            },
                            |r| r.get(0),
                        )
                        .optional()
                        .map_err(err)?;
                    Applied::TakeOver(g.map(u32::try_from).transpose().map_err(err)?)
                }
                StoreOp::MarkUnknown {
                    seen_token, ttl_ms, ..
                } => {
                    let ttl = i64::try_from(*ttl_ms).map_err(err)?;
                    Applied::Applied(self.changes(
                        &self.texts.mark_unknown.clone(),
                        named_params! {":scope": scope, ":seen": &seen_token.0[..], ":ttl": ttl, ":now": now},
                    )?)
                }
                StoreOp::Complete {
                    token,
                    response,
                    ttl_ms,
                    ..
                } => {
                    let ttl = i64::try_from(*ttl_ms).map_err(err)?;
                    Applied::Applied(self.changes(
                        &self.texts.complete.clone(),
                        named_params! {
                            ":scope": scope, ":token": &token.0[..], ":response": response,
                            ":ttl": ttl, ":now": now,
                        },
                    )?)
                }
                StoreOp::Release { token, .. } => Applied::Applied(self.changes(
                    &self.texts.release.clone(),
                    named_params! {":scope": scope, ":token": &token.0[..]},
                )?),
                StoreOp::Renew {
                    token, lease_ms, ..
                } => {
                    let lease = i64::try_from(*lease_ms).map_err(err)?;
                    Applied::Applied(self.changes(
                        &self.texts.renew.clone(),
                        named_params! {":scope": scope, ":token": &token.0[..], ":lease": lease, ":now": now},
                    )?)
                }
                StoreOp::Commit { .. } => return Err("COMMIT is not a store recipe".into()),
            },
        };
        Ok((applied, self.read(now_ms)?))
    }
}

/// The shipped SQLite schema and recipes, as SQLite plans them (`spec/STORAGE.md` §7): the
/// statements a request runs build no temporary b-tree beyond the one a `RETURNING` clause
/// buffers its row in, and the state check admits exactly the states 1, 2 and 3.
#[cfg(test)]
mod plans {
    use idempo_core::recipes;
    use rusqlite::Connection;

    fn db() -> Connection {
        let db = Connection::open_in_memory().expect("an in-memory database");
        db.execute_batch(recipes::SQLITE_SCHEMA)
            .expect("the shipped schema");
        db
    }

    /// How many `OpenEphemeral` operations SQLite's plan for `sql` has (every parameter bound to
    /// NULL: the plan does not depend on the values).
    fn ephemeral_tables(db: &Connection, sql: &str) -> usize {
        let mut stmt = db
            .prepare(&format!("EXPLAIN {sql}"))
            .unwrap_or_else(|e| panic!("{e}: {sql}"));
        let nulls = std::iter::repeat_n(rusqlite::types::Null, stmt.parameter_count());
        let mut rows = stmt
            .query(rusqlite::params_from_iter(nulls))
            .expect("EXPLAIN runs");
        let mut n = 0;
        while let Some(row) = rows.next().expect("a plan row") {
            let op: String = row.get(1).expect("the opcode column");
            n += usize::from(op == "OpenEphemeral");
        }
        n
    }

    #[test]
    fn per_request_statements_build_no_temporary_btree_but_a_returning_buffer() {
        let db = db();
        for (name, sql) in [
            ("claim", recipes::SQLITE_CLAIM),
            ("get", recipes::SQLITE_GET),
            ("takeover", recipes::SQLITE_TAKEOVER),
            ("mark_unknown", recipes::SQLITE_MARK_UNKNOWN),
            ("complete", recipes::SQLITE_COMPLETE),
            ("release", recipes::SQLITE_RELEASE),
            ("renew", recipes::SQLITE_RENEW),
        ] {
            let returning = usize::from(sql.contains("RETURNING"));
            assert_eq!(
                ephemeral_tables(&db, sql),
                returning,
                "the {name} recipe builds a temporary b-tree per call (a constant IN list in a \
                 CHECK or the statement does): {sql}"
            );
        }
    }

    #[test]
    fn the_state_check_admits_exactly_1_2_and_3() {
        let db = db();
        let insert = |state: rusqlite::types::Value, n: u8| {
            db.execute(
                "INSERT INTO idempo_record (scope_key, fingerprint, state, token, generation, \
                 lease_until, expires_at, response) VALUES (?1, 'fp', ?2, ?3, 1, NULL, 1, NULL)",
                rusqlite::params![vec![n; 32], state, vec![0u8; 16]],
            )
        };
        use rusqlite::types::Value as V;
        for (n, state) in [V::Integer(1), V::Integer(2), V::Integer(3), V::Real(2.0)]
            .into_iter()
            .enumerate()
        {
            assert!(
                insert(state.clone(), n as u8).is_ok(),
                "state {state:?} refused"
            );
        }
        for (n, state) in [
            V::Integer(0),
            V::Integer(4),
            V::Integer(-1),
            V::Real(1.5),
            V::Null,
            V::Text("x".into()),
            V::Blob(vec![1]),
        ]
        .into_iter()
        .enumerate()
        {
            assert!(
                insert(state.clone(), 100 + n as u8).is_err(),
                "state {state:?} admitted"
            );
        }
    }
}
