//! The SQLite store's group commit (`src/store/sqlite.rs`): concurrent primitives share one
//! `BEGIN IMMEDIATE … COMMIT`, every one of them is durable when answered, and a primitive that
//! fails inside a batch (its own savepoint) does not fail the others.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::time::Duration;

use idempo_core::machine::{StoreOp, StoreResult};
use idempo_core::record::{FencingToken, FingerprintText};
use idempo_core::scope::ScopeId;
use idempo_gateway::store::sqlite::SqliteStore;
use idempo_gateway::store::{Clock, StoreError};

fn temp_db(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("idempo-gateway-batch-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("store.sqlite3")
}

fn scope(i: u32) -> ScopeId {
    let mut b = [0u8; 32];
    b[..4].copy_from_slice(&i.to_be_bytes());
    b[31] = 0x5a;
    ScopeId::from_bytes(b)
}

fn claim(i: u32) -> StoreOp {
    let mut t = [0u8; 16];
    t[..4].copy_from_slice(&i.to_be_bytes());
    StoreOp::Claim {
        scope: scope(i),
        fingerprint: FingerprintText::new(format!("v1:{i:064x}")).unwrap(),
        token: FencingToken::from_slice(&t).unwrap(),
        lease_ms: 30_000,
        ttl_ms: 60_000,
    }
}

/// A trigger on `conn`'s database that refuses the insert of `scope(i)`.
fn poison(conn: &rusqlite::Connection, i: u32) {
    let hex: String = scope(i)
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    conn.execute_batch(&format!(
        "CREATE TRIGGER poison BEFORE INSERT ON idempo_record \
         WHEN NEW.scope_key = X'{hex}' BEGIN SELECT RAISE(ABORT, 'poisoned by the test'); END"
    ))
    .unwrap();
}

fn rows(path: &PathBuf) -> i64 {
    let c = rusqlite::Connection::open(path).unwrap();
    c.query_row("SELECT count(*) FROM idempo_record", [], |r| r.get(0))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_on_distinct_keys_all_commit_in_fewer_transactions() {
    let path = temp_db("many");
    let store = SqliteStore::open(&path, 5000, Clock::System).unwrap();
    const N: u32 = 300;
    let mut tasks = Vec::new();
    for i in 0..N {
        let s = store.clone();
        tasks.push(tokio::spawn(async move { s.run(claim(i)).await }));
    }
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        assert!(
            matches!(r, StoreResult::Claimed { generation: 1, .. }),
            "{r:?}"
        );
    }
    // Answered means committed: another connection sees every record.
    assert_eq!(rows(&path), i64::from(N));
    let stats = store.batch_stats();
    assert_eq!(stats.ops(), u64::from(N));
    assert!(
        stats.transactions() < stats.ops(),
        "{} transactions for {} primitives: no batching",
        stats.transactions(),
        stats.ops()
    );
    // A replay of each claim finds its committed record.
    for i in [0, N / 2, N - 1] {
        let r = store.run(claim(i)).await.unwrap();
        assert!(matches!(r, StoreResult::Existing { .. }), "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primitive_failing_inside_a_batch_fails_alone() {
    let path = temp_db("poison");
    let store = SqliteStore::open(&path, 5000, Clock::System).unwrap();
    let poisoned = 7u32;
    let other = rusqlite::Connection::open(&path).unwrap();
    other.busy_timeout(Duration::from_secs(5)).unwrap();
    poison(&other, poisoned);
    // Hold the write lock: the writer waits in BEGIN IMMEDIATE with a first primitive while the
    // next ones queue behind it, so they all run in the second transaction.
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let s = store.clone();
    let primer = tokio::spawn(async move { s.run(claim(1000)).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut tasks = Vec::new();
    for i in 0..20u32 {
        let s = store.clone();
        tasks.push((i, tokio::spawn(async move { s.run(claim(i)).await })));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    other.execute_batch("COMMIT").unwrap();
    assert!(matches!(
        primer.await.unwrap().unwrap(),
        StoreResult::Claimed { .. }
    ));
    for (i, t) in tasks {
        let r = t.await.unwrap();
        if i == poisoned {
            match r {
                Err(StoreError::Sqlite(e)) => {
                    assert!(e.to_string().contains("poisoned"), "{e}");
                }
                other => panic!("the poisoned claim answered {other:?}"),
            }
        } else {
            assert!(
                matches!(r, Ok(StoreResult::Claimed { .. })),
                "claim {i}: {r:?}"
            );
        }
    }
    let stats = store.batch_stats();
    assert_eq!(stats.transactions(), 2, "the primer's, then one for the 20");
    assert_eq!(stats.ops(), 21);
    assert_eq!(
        rows(&path),
        20,
        "the primer and 19 claims, not the poisoned one"
    );
    let got = store
        .run(StoreOp::Get {
            scope: scope(poisoned),
        })
        .await
        .unwrap();
    assert!(
        matches!(got, StoreResult::Got { record: None, .. }),
        "{got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_alone_that_fails_is_rolled_back_and_the_next_one_commits() {
    let path = temp_db("alone");
    let store = SqliteStore::open(&path, 5000, Clock::System).unwrap();
    let other = rusqlite::Connection::open(&path).unwrap();
    poison(&other, 3);
    match store.run(claim(3)).await {
        Err(StoreError::Sqlite(e)) => assert!(e.to_string().contains("poisoned"), "{e}"),
        other => panic!("the poisoned claim answered {other:?}"),
    }
    // The next write runs in a transaction of its own on the same connection, and commits.
    assert!(matches!(
        store.run(claim(4)).await,
        Ok(StoreResult::Claimed { .. })
    ));
    assert_eq!(rows(&path), 1, "only the second claim");
    assert_eq!(store.batch_stats().transactions(), 2);
}

#[test]
fn the_synchronous_path_runs_on_the_writer_too() {
    let path = temp_db("sync");
    let store = SqliteStore::open(&path, 5000, Clock::System).unwrap();
    assert!(matches!(
        store.run_sync(&claim(1)).unwrap(),
        StoreResult::Claimed { .. }
    ));
    assert!(matches!(
        store.run_sync(&claim(1)).unwrap(),
        StoreResult::Existing { .. }
    ));
    assert_eq!(store.purge_sync(10).unwrap().completed, 0);
    assert_eq!(store.batch_stats().transactions(), 3);
}
