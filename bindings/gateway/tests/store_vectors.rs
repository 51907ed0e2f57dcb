//! Runs the store conformance scenarios (`spec/vectors/store/*.json`, format in
//! `spec/vectors/README.md`) against the gateway's memory store and its SQLite store (a real
//! file, core's recipe texts, the clock override bound to `:now`), and against its PostgreSQL
//! store directly and through a transaction-pooling PgBouncer (`IDEMPO_TEST_PG_DSN`,
//! `IDEMPO_TEST_PGBOUNCER_DSN` as `scripts/test-services.sh start` writes them; without them
//! those tests print a notice and pass). Each PostgreSQL scenario runs in a schema of its own
//! (`idempo_gw_vec_<tag>_<pid>_<n>`, dropped at the end), so parallel runs never share a table.
//! The Redis store runs them on one server (`IDEMPO_TEST_REDIS_URL`) and on a Redis Cluster
//! (`IDEMPO_TEST_REDIS_CLUSTER_NODES`, `host:port,...`), each scenario under a prefix of its own
//! (its keys deleted at the end), with a real-time origin (`PEXPIRE` is real time); scenarios
//! that require `"purge"` are skipped there (Redis expires hashes itself, `spec/STORAGE.md` §5.1).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idempo_core::machine::memory::PurgeCounts;
use idempo_core::machine::{StoreOp, StoreResult};
use idempo_core::record::{FencingToken, FingerprintText, Record};
use idempo_core::scope::ScopeId;
use idempo_gateway::store::memory::MemStore;
use idempo_gateway::store::postgres::{PostgresOptions, PostgresStore};
use idempo_gateway::store::redis::{RedisOptions, RedisStore, RedisTarget};
use idempo_gateway::store::sqlite::SqliteStore;
use idempo_gateway::store::{Clock, StoreError};
use serde_json::Value;

const T0: u64 = 1_700_000_000_000;

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../spec/vectors/store")
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

trait Under {
    fn run(&self, op: StoreOp) -> Result<StoreResult, StoreError>;
    fn purge(&self, batch: u64) -> Result<PurgeCounts, StoreError>;
}

impl Under for MemStore {
    fn run(&self, op: StoreOp) -> Result<StoreResult, StoreError> {
        MemStore::run(self, op, None)
    }
    fn purge(&self, batch: u64) -> Result<PurgeCounts, StoreError> {
        Ok(self.purge_expired(batch))
    }
}

impl Under for SqliteStore {
    fn run(&self, op: StoreOp) -> Result<StoreResult, StoreError> {
        self.run_sync(&op)
    }
    fn purge(&self, batch: u64) -> Result<PurgeCounts, StoreError> {
        self.purge_sync(batch)
    }
}

/// The PostgreSQL store driven from a synchronous test on a runtime of its own.
struct Pg {
    rt: tokio::runtime::Runtime,
    store: PostgresStore,
}

impl Under for Pg {
    fn run(&self, op: StoreOp) -> Result<StoreResult, StoreError> {
        self.rt.block_on(self.store.run(op))
    }
    fn purge(&self, batch: u64) -> Result<PurgeCounts, StoreError> {
        self.rt.block_on(self.store.purge_expired(batch))
    }
}

/// The Redis store driven from a synchronous test on a runtime of its own.
struct Rd {
    rt: tokio::runtime::Runtime,
    store: RedisStore,
}

impl Under for Rd {
    fn run(&self, op: StoreOp) -> Result<StoreResult, StoreError> {
        self.rt.block_on(self.store.run(op))
    }
    fn purge(&self, batch: u64) -> Result<PurgeCounts, StoreError> {
        self.rt.block_on(self.store.purge_expired(batch))
    }
}

fn now_ms() -> u64 {
    Clock::System.now_ms()
}

/// The Redis target of `var` (`IDEMPO_TEST_REDIS_URL`, or `IDEMPO_TEST_REDIS_CLUSTER_NODES` as
/// `host:port,...`), or none (with a notice) when unset.
fn redis_target(var: &str) -> Option<RedisTarget> {
    let Ok(v) = std::env::var(var) else {
        eprintln!("{var} is not set: skipping (scripts/test-services.sh start DIR writes it)");
        return None;
    };
    Some(if var.ends_with("CLUSTER_NODES") {
        RedisTarget::Cluster(v.split(',').map(|n| format!("redis://{n}")).collect())
    } else {
        RedisTarget::Node(v)
    })
}

/// Deletes the records of `scopes` under `prefix` (a claim on each, then a release with the
/// token read back would do the same; a plain DEL through a client of its own is simpler).
async fn delete_keys(target: &RedisTarget, prefix: &str, scopes: &[ScopeId]) {
    let keys: Vec<Vec<u8>> = scopes
        .iter()
        .map(|s| idempo_core::recipes::redis_key(prefix.as_bytes(), s.as_bytes()))
        .collect();
    match target {
        RedisTarget::Node(url) => {
            let Ok(mut c) = redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
            else {
                return;
            };
            for k in keys {
                let _: Result<i64, _> = redis::cmd("DEL").arg(k).query_async(&mut c).await;
            }
        }
        RedisTarget::Cluster(nodes) => {
            let client = redis::cluster::ClusterClient::new(nodes.clone()).unwrap();
            let Ok(mut c) = client.get_async_connection().await else {
                return;
            };
            for k in keys {
                let _: Result<i64, _> = redis::cmd("DEL").arg(k).query_async(&mut c).await;
            }
        }
    }
}

fn scenarios_on_redis(var: &str, tag: &str) {
    let Some(target) = redis_target(var) else {
        return;
    };
    let (mut steps, mut skipped) = (0, 0);
    for (i, f) in scenarios().into_iter().enumerate() {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        if v["requires"]
            .as_array()
            .is_some_and(|r| r.iter().any(|x| x == "purge"))
        {
            skipped += 1;
            continue;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let prefix = format!("idempo:gwvec:{tag}:{}:{i}:", std::process::id());
        let t0 = now_ms();
        let clock = Arc::new(AtomicU64::new(t0));
        let mut options = RedisOptions::new(target.clone());
        options.prefix = prefix.clone();
        let store = rt
            .block_on(RedisStore::open(&options, Clock::Fixed(clock.clone())))
            .unwrap();
        let scopes: Vec<ScopeId> = Names::load(&v).scopes.values().copied().collect();
        let rd = Rd { rt, store };
        steps += run_scenario(&f, &rd, &clock, t0);
        rd.rt.block_on(delete_keys(&target, &prefix, &scopes));
    }
    assert!(steps > 50, "{steps} steps");
    assert_eq!(skipped, 1, "only purge_counts requires purge");
}

#[test]
fn store_scenarios_pass_on_the_redis_store() {
    scenarios_on_redis("IDEMPO_TEST_REDIS_URL", "node");
}

#[test]
fn store_scenarios_pass_on_the_redis_cluster_store() {
    scenarios_on_redis("IDEMPO_TEST_REDIS_CLUSTER_NODES", "cluster");
}

/// Drops `schema` (best effort).
async fn drop_schema(dsn: &str, schema: &str) {
    if let Ok((c, conn)) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await {
        tokio::spawn(conn);
        let _ = c
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .await;
    }
}

fn scenarios_on_postgres(var: &str, tag: &str) {
    let Ok(dsn) = std::env::var(var) else {
        eprintln!("{var} is not set: skipping (scripts/test-services.sh start DIR writes it)");
        return;
    };
    let mut steps = 0;
    for (i, f) in scenarios().into_iter().enumerate() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let schema = format!("idempo_gw_vec_{tag}_{}_{i}", std::process::id());
        rt.block_on(drop_schema(&dsn, &schema));
        let clock = Arc::new(AtomicU64::new(T0));
        let mut options = PostgresOptions::new(dsn.clone());
        options.schema = Some(schema.clone());
        options.pool_size = 2;
        let store = rt
            .block_on(PostgresStore::open(&options, Clock::Fixed(clock.clone())))
            .unwrap();
        let pg = Pg { rt, store };
        steps += run_scenario(&f, &pg, &clock, T0);
        pg.rt.block_on(drop_schema(&dsn, &schema));
    }
    assert!(steps > 50, "{steps} steps");
}

#[test]
fn store_scenarios_pass_on_the_postgres_store() {
    scenarios_on_postgres("IDEMPO_TEST_PG_DSN", "pg");
}

#[test]
fn store_scenarios_pass_on_the_postgres_store_through_pgbouncer() {
    scenarios_on_postgres("IDEMPO_TEST_PGBOUNCER_DSN", "bouncer");
}

struct Names {
    scopes: BTreeMap<String, ScopeId>,
    tokens: BTreeMap<String, FencingToken>,
    responses: BTreeMap<String, Vec<u8>>,
}

impl Names {
    fn load(v: &Value) -> Self {
        let obj = |k: &str| v[k].as_object().expect("map").clone();
        Self {
            scopes: obj("scopes")
                .iter()
                .map(|(k, h)| {
                    let b: [u8; 32] = unhex(h.as_str().unwrap()).try_into().unwrap();
                    (k.clone(), ScopeId::from_bytes(b))
                })
                .collect(),
            tokens: obj("tokens")
                .iter()
                .map(|(k, h)| {
                    (
                        k.clone(),
                        FencingToken::from_slice(&unhex(h.as_str().unwrap())).unwrap(),
                    )
                })
                .collect(),
            responses: obj("responses")
                .iter()
                .map(|(k, h)| (k.clone(), unhex(h.as_str().unwrap())))
                .collect(),
        }
    }
    fn scope(&self, s: &Value) -> ScopeId {
        self.scopes[s["scope"].as_str().unwrap()]
    }
    fn token(&self, s: &Value, f: &str) -> FencingToken {
        self.tokens[s[f].as_str().unwrap()]
    }
}

fn u(v: &Value, f: &str) -> u64 {
    v[f].as_u64().unwrap_or_else(|| panic!("{f} in {v}"))
}

fn check_record(names: &Names, got: Option<&Record>, want: &Value, ctx: &str, t0: u64) {
    let Some(got) = got else {
        assert!(want.is_null(), "{ctx}: expected {want}, got none");
        return;
    };
    assert!(!want.is_null(), "{ctx}: expected none, got {got:?}");
    let row = got.to_row().unwrap();
    assert_eq!(
        row.fingerprint,
        want["fingerprint"].as_str().unwrap(),
        "{ctx}"
    );
    assert_eq!(row.state, want["state"].as_i64().unwrap(), "{ctx}: state");
    assert_eq!(
        FencingToken::from_slice(&row.token).unwrap(),
        names.tokens[want["token"].as_str().unwrap()],
        "{ctx}: token"
    );
    let gen_ok = row.generation == want["generation"].as_i64().unwrap()
        || (want["generation_restart_allowed"] == Value::Bool(true) && row.generation == 1);
    assert!(gen_ok, "{ctx}: generation {}", row.generation);
    assert_eq!(
        row.lease_until_ms.map(|v| v as u64 - t0),
        want["lease_until_ms"].as_u64(),
        "{ctx}: lease_until"
    );
    assert_eq!(
        row.expires_at_ms as u64 - t0,
        u(want, "expires_at_ms"),
        "{ctx}: expires_at"
    );
    let resp = want["response"]
        .as_str()
        .map(|n| names.responses[n].clone());
    assert_eq!(row.response, resp, "{ctx}: response");
}

fn run_scenario(path: &Path, store: &dyn Under, clock: &AtomicU64, t0: u64) -> usize {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let name = v["name"].as_str().unwrap().to_owned();
    let names = Names::load(&v);
    clock.store(t0, Ordering::SeqCst);
    let steps = v["steps"].as_array().unwrap();
    for (i, step) in steps.iter().enumerate() {
        let ctx = format!("{name} step {i}");
        if let Some(ms) = step.get("advance_ms") {
            clock.fetch_add(ms.as_u64().unwrap(), Ordering::SeqCst);
            continue;
        }
        let expect = &step["expect"];
        let scope = || names.scope(step);
        match step["op"].as_str().unwrap() {
            "claim" => {
                let r = store
                    .run(StoreOp::Claim {
                        scope: scope(),
                        fingerprint: FingerprintText::new(step["fingerprint"].as_str().unwrap())
                            .unwrap(),
                        token: names.token(step, "token"),
                        lease_ms: u(step, "lease_ms"),
                        ttl_ms: u(step, "ttl_ms"),
                    })
                    .unwrap();
                match r {
                    StoreResult::Claimed { generation, now_ms } => {
                        assert_eq!(now_ms - t0, u(expect, "now_ms"), "{ctx}: now");
                        let want = &expect["claimed"];
                        assert!(want.is_object(), "{ctx}: expected {expect}, got claimed");
                        let g = u64::from(generation);
                        assert!(
                            g == u(want, "generation")
                                || (want["restart_allowed"] == Value::Bool(true) && g == 1),
                            "{ctx}: generation {g}"
                        );
                    }
                    StoreResult::Existing { record, now_ms } => {
                        assert_eq!(now_ms - t0, u(expect, "now_ms"), "{ctx}: now");
                        assert!(expect["existing"].is_object(), "{ctx}: got existing");
                        check_record(&names, Some(&record), &expect["existing"], &ctx, t0);
                    }
                    other => panic!("{ctx}: {other:?}"),
                }
            }
            "get" => match store.run(StoreOp::Get { scope: scope() }).unwrap() {
                StoreResult::Got { record, .. } => {
                    check_record(&names, record.as_ref(), &expect["record"], &ctx, t0);
                }
                other => panic!("{ctx}: {other:?}"),
            },
            "takeover" => {
                let r = store
                    .run(StoreOp::TakeOver {
                        scope: scope(),
                        seen_token: names.token(step, "seen_token"),
                        new_token: names.token(step, "new_token"),
                        lease_ms: u(step, "lease_ms"),
                    })
                    .unwrap();
                assert_eq!(
                    r,
                    StoreResult::TookOver(expect["generation"].as_u64().map(|g| g as u32)),
                    "{ctx}"
                );
            }
            "mark_unknown" => {
                let r = store
                    .run(StoreOp::MarkUnknown {
                        scope: scope(),
                        seen_token: names.token(step, "seen_token"),
                        ttl_ms: u(step, "ttl_ms"),
                    })
                    .unwrap();
                let want = expect["applied"].as_bool().unwrap();
                assert_eq!(r, StoreResult::MarkedUnknown(want), "{ctx}");
            }
            "complete" => {
                let r = store
                    .run(StoreOp::Complete {
                        scope: scope(),
                        token: names.token(step, "token"),
                        response: names.responses[step["response"].as_str().unwrap()].clone(),
                        ttl_ms: u(step, "ttl_ms"),
                    })
                    .unwrap();
                let want = expect["applied"].as_bool().unwrap();
                assert_eq!(r, StoreResult::Completed(want), "{ctx}");
            }
            "release" => {
                let r = store
                    .run(StoreOp::Release {
                        scope: scope(),
                        token: names.token(step, "token"),
                    })
                    .unwrap();
                let want = expect["applied"].as_bool().unwrap();
                assert_eq!(r, StoreResult::Released(want), "{ctx}");
            }
            "renew" => {
                let r = store
                    .run(StoreOp::Renew {
                        scope: scope(),
                        token: names.token(step, "token"),
                        lease_ms: u(step, "lease_ms"),
                    })
                    .unwrap();
                let want = expect["applied"].as_bool().unwrap();
                assert_eq!(r, StoreResult::Renewed(want), "{ctx}");
            }
            "purge_expired" => {
                let got = store.purge(u(step, "batch")).unwrap();
                assert_eq!(
                    (got.in_progress, got.completed, got.outcome_unknown),
                    (
                        u(expect, "in_progress"),
                        u(expect, "completed"),
                        u(expect, "outcome_unknown")
                    ),
                    "{ctx}"
                );
            }
            other => panic!("{ctx}: unknown op {other}"),
        }
    }
    steps.len()
}

fn scenarios() -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(vectors_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 15, "found {}", files.len());
    files
}

fn temp_db(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "idempo-gateway-{tag}-{}-{}",
        std::process::id(),
        T0
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("store.sqlite3")
}

#[test]
fn store_scenarios_pass_on_the_memory_store() {
    let mut steps = 0;
    for f in scenarios() {
        let clock = Arc::new(AtomicU64::new(T0));
        let store = MemStore::new(100_000, 64 << 20, Clock::Fixed(clock.clone()));
        steps += run_scenario(&f, &store, &clock, T0);
    }
    assert!(steps > 50, "{steps} steps");
}

#[test]
fn store_scenarios_pass_on_the_sqlite_store() {
    let mut steps = 0;
    for (i, f) in scenarios().into_iter().enumerate() {
        let path = temp_db(&format!("vectors{i}"));
        let clock = Arc::new(AtomicU64::new(T0));
        let store = SqliteStore::open(&path, 5000, Clock::Fixed(clock.clone())).unwrap();
        steps += run_scenario(&f, &store, &clock, T0);
    }
    assert!(steps > 50, "{steps} steps");
}

#[test]
fn an_altered_expectation_fails_on_sqlite() {
    let text = std::fs::read_to_string(vectors_dir().join("complete_checks_token.json")).unwrap();
    let altered = text.replacen("\"applied\": false", "\"applied\": true", 1);
    assert_ne!(text, altered);
    let path = temp_db("altered");
    let json = path.with_file_name("altered.json");
    std::fs::write(&json, altered).unwrap();
    let clock = Arc::new(AtomicU64::new(T0));
    let store = SqliteStore::open(&path, 5000, Clock::Fixed(clock.clone())).unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_scenario(&json, &store, &clock, T0)
    }));
    assert!(result.is_err(), "an altered scenario must fail");
}

#[test]
fn the_sqlite_file_is_wal_with_core_schema() {
    let path = temp_db("wal");
    let _store = SqliteStore::open(&path, 5000, Clock::System).unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode.to_ascii_lowercase(), "wal");
    let sql: String = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'idempo_record'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let schema = idempo_core::recipes::SQLITE_SCHEMA.replace("IF NOT EXISTS ", "");
    assert!(schema.starts_with(&sql), "{sql}");
}
