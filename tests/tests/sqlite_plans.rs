//! The shipped SQLite schema and recipes, as SQLite plans them (`spec/STORAGE.md` §7): the
//! statements a request runs build no temporary b-tree beyond the one a `RETURNING` clause
//! buffers its row in, and the state check admits exactly the states 1, 2 and 3.
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
fn per_request_statements_build_no_temporary_btree_but_returning_s() {
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
