//! The gateway on PostgreSQL through real sockets: the built binary in front of an upstream, its
//! store a real server (through a transaction-pooling PgBouncer for the proxy cases).
//!
//! Needs `IDEMPO_TEST_PG_DSN` and `IDEMPO_TEST_PGBOUNCER_DSN`, as `scripts/test-services.sh
//! start DIR` writes them to DIR/env (`make test-gateway` starts the servers); without them each
//! test prints a notice and passes. Each test works in a schema of its own, dropped at the end.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::relay::Relay;
use common::{Gateway, client, config, get, post, temp_dir, upstream};
use idempo_core::recipes;
use tokio_postgres::types::Type;

const ALICE: (&str, &str) = ("X-Principal", "alice");

fn dsn(var: &str) -> Option<String> {
    let v = std::env::var(var).ok();
    if v.is_none() {
        eprintln!("{var} is not set: skipping (scripts/test-services.sh start DIR writes it)");
    }
    v
}

/// A schema of this test's own, dropped when it ends.
struct Schema {
    dsn: String,
    name: String,
}

impl Schema {
    fn new(dsn: &str, tag: &str) -> Self {
        Self {
            dsn: dsn.to_owned(),
            name: format!("idempo_gw_it_{tag}_{}", std::process::id()),
        }
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (dsn, name) = (self.dsn.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok((c, conn)) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await {
                    tokio::spawn(conn);
                    let _ = c
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                        .await;
                }
            });
        })
        .join();
    }
}

async fn connect(dsn: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    c
}

fn pg_store(dsn: &str, schema: &str, extra: &str) -> String {
    format!("kind = \"postgres\"\ndsn = \"{dsn}\"\nschema = \"{schema}\"\n{extra}")
}

#[tokio::test]
async fn replay_mismatch_and_a_concurrent_duplicate_through_pgbouncer() {
    let Some(bouncer) = dsn("IDEMPO_TEST_PGBOUNCER_DSN") else {
        return;
    };
    let schema = Schema::new(&bouncer, "proxy");
    let dir = temp_dir("pg-proxy");
    let (up, seen) = upstream().await;
    let store = pg_store(&bouncer, &schema.name, "pool_size = 4");
    let gw = Gateway::start(&dir, &config(&store, up, "/payments", ""));
    let c = client();
    assert_eq!(get(&c, &gw.url("/readyz")).await.status, 200);

    // Replay: the upstream runs once.
    let h = [("Idempotency-Key", "key-0000-pg-replay"), ALICE];
    let url = gw.url("/payments");
    let first = post(&c, &url, &h, r#"{"amount":10}"#).await.unwrap();
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(first.header("idempotent-replayed").is_none());
    let again = post(&c, &url, &h, r#"{ "amount" : 10 }"#).await.unwrap();
    assert_eq!(again.status, 201, "{}", again.text());
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!(seen.lock().unwrap().calls.get("/payments"), Some(&1));

    // Mismatch: 422, nothing forwarded.
    let other = post(&c, &url, &h, r#"{"amount":11}"#).await.unwrap();
    assert_eq!(other.status, 422, "{}", other.text());
    assert_eq!(other.problem_type(), "urn:idempo:problem:key-reused");
    assert_eq!(seen.lock().unwrap().calls.get("/payments"), Some(&1));
    drop(gw);

    // A concurrent duplicate: 409 while the first runs, then the replay.
    let gw = Gateway::start(&dir, &config(&store, up, "/slow", ""));
    let url = gw.url("/slow?ms=1500");
    let h = [("Idempotency-Key", "key-0000-pg-dup"), ALICE];
    let first = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { post(&c, &url, &h, r#"{"amount":1}"#).await })
    };
    while !seen.lock().unwrap().calls.contains_key("/slow") {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let dup = post(&c, &url, &h, r#"{"amount":1}"#).await.unwrap();
    assert_eq!(dup.status, 409, "{}", dup.text());
    assert_eq!(dup.problem_type(), "urn:idempo:problem:in-flight");
    assert!(dup.header("retry-after").is_some());
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status, 201, "{}", first.text());
    let replay = post(&c, &url, &h, r#"{"amount":1}"#).await.unwrap();
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.body, first.body);
    assert_eq!(seen.lock().unwrap().calls.get("/slow"), Some(&1));
}

fn host_port(dsn: &str) -> ((String, u16), String, String) {
    let cfg: tokio_postgres::Config = dsn.parse().unwrap();
    let host = match &cfg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        other => panic!("not a TCP host: {other:?}"),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let user = cfg.get_user().unwrap_or("postgres").to_owned();
    let db = cfg.get_dbname().unwrap_or(&user).to_owned();
    ((host, port), user, db)
}

// Multi-threaded: the relay must answer while `Gateway::start` blocks this thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_is_503_and_nothing_is_forwarded() {
    let Some(pg) = dsn("IDEMPO_TEST_PG_DSN") else {
        return;
    };
    let schema = Schema::new(&pg, "down");
    let (target, user, db) = host_port(&pg);
    let mut relay = Relay::start(target).await;
    let via = format!("postgresql://{user}@127.0.0.1:{}/{db}", relay.port);
    let dir = temp_dir("pg-down");
    let (up, seen) = upstream().await;
    let store = pg_store(&via, &schema.name, "timeout_ms = 500");
    let gw = Gateway::start(&dir, &config(&store, up, "/payments", ""));
    let c = client();
    let url = gw.url("/payments");
    let ok = post(
        &c,
        &url,
        &[("Idempotency-Key", "key-0000-pg-up"), ALICE],
        "{}",
    )
    .await
    .unwrap();
    assert_eq!(ok.status, 201, "{}", ok.text());
    let calls = || seen.lock().unwrap().calls.get("/payments").copied();
    assert_eq!(calls(), Some(1));

    // The server stops answering: each primitive ends at timeout_ms, 503, nothing forwarded.
    relay.freeze();
    let h = [("Idempotency-Key", "key-0000-pg-frozen"), ALICE];
    let started = Instant::now();
    let frozen = post(&c, &url, &h, "{}").await.unwrap();
    assert_eq!(frozen.status, 503, "{}", frozen.text());
    assert_eq!(
        frozen.problem_type(),
        "urn:idempo:problem:store-unavailable"
    );
    assert!(frozen.header("retry-after").is_some());
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(get(&c, &gw.url("/readyz")).await.status, 503);
    assert_eq!(calls(), Some(1), "nothing forwarded");

    // It comes back: the same key now runs.
    relay.resume();
    let back = post(&c, &url, &h, "{}").await.unwrap();
    assert_eq!(back.status, 201, "{}", back.text());
    assert_eq!(calls(), Some(2));

    // The server goes away (connections closed, then refused): 503, nothing forwarded.
    relay.cut();
    let h = [("Idempotency-Key", "key-0000-pg-cut"), ALICE];
    let cut = post(&c, &url, &h, "{}").await.unwrap();
    assert_eq!(cut.status, 503, "{}", cut.text());
    assert_eq!(cut.problem_type(), "urn:idempo:problem:store-unavailable");
    assert_eq!(get(&c, &gw.url("/readyz")).await.status, 503);
    assert_eq!(calls(), Some(2), "nothing forwarded");
    let metrics = get(&c, &gw.url("/metrics")).await.text();
    assert!(
        metrics.contains("idempo_store_errors_total{route=\"/payments\",op=\"claim\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_record_the_gateway_wrote_is_read_by_the_same_recipes() {
    let Some(pg) = dsn("IDEMPO_TEST_PG_DSN") else {
        return;
    };
    let schema = Schema::new(&pg, "interop");
    let dir = temp_dir("pg-interop");
    let (up, _seen) = upstream().await;
    let gw = Gateway::start(
        &dir,
        &config(&pg_store(&pg, &schema.name, ""), up, "/payments", ""),
    );
    let c = client();
    let h = [("Idempotency-Key", "key-0000-pg-interop"), ALICE];
    let a = post(&c, &gw.url("/payments"), &h, r#"{"amount":7}"#)
        .await
        .unwrap();
    assert_eq!(a.status, 201, "{}", a.text());

    let db = connect(&pg).await;
    // The table is the bindings' table: core's DDL, column for column.
    let columns = |s: String| {
        let db = &db;
        async move {
            db.query_typed(
                "SELECT column_name::text, data_type::text, is_nullable::text
                   FROM information_schema.columns
                  WHERE table_schema = $1::text AND table_name = 'idempo_record'
                  ORDER BY ordinal_position",
                &[(&s, Type::TEXT)],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r.get::<_, String>(0),
                    r.get::<_, String>(1),
                    r.get::<_, String>(2),
                )
            })
            .collect::<Vec<_>>()
        }
    };
    let reference = format!("{}_ref", schema.name);
    let _ref_schema = Schema {
        dsn: pg.clone(),
        name: reference.clone(),
    };
    let table = format!("\"{reference}\".idempo_record");
    db.batch_execute(&format!(
        "CREATE SCHEMA \"{reference}\"; {}",
        recipes::rename_table(recipes::POSTGRES_SCHEMA, &table)
    ))
    .await
    .unwrap();
    let ours = columns(schema.name.clone()).await;
    assert_eq!(ours.len(), 8, "{ours:?}");
    assert_eq!(ours, columns(reference).await);

    // The one record, read back by core's get recipe under its own scope key.
    let table = format!("\"{}\".idempo_record", schema.name);
    let rows = db
        .query_typed(&format!("SELECT scope_key FROM {table}"), &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    let scope: Vec<u8> = rows[0].get(0);
    let none: Option<i64> = None;
    let got = db
        .query_typed(
            &recipes::rename_table(recipes::POSTGRES_GET, &table),
            &[(&scope.as_slice(), Type::BYTEA), (&none, Type::INT8)],
        )
        .await
        .unwrap();
    let row = &got[0];
    let record = idempo_core::record::Record::from_row(idempo_core::record::RecordRow {
        fingerprint: row.get(0),
        state: i64::from(row.get::<_, i16>(1)),
        token: row.get(2),
        generation: i64::from(row.get::<_, i32>(3)),
        lease_until_ms: row.get(4),
        expires_at_ms: row.get(5),
        response: row.get(6),
    })
    .unwrap();
    assert!(
        matches!(
            record.state,
            idempo_core::record::RecordState::Completed { .. }
        ),
        "{record:?}"
    );
    let stored = row.get::<_, Option<Vec<u8>>>(6).unwrap();
    let body = String::from_utf8_lossy(&a.body).into_owned();
    assert!(
        stored
            .windows(a.body.len().max(1))
            .any(|w| w == a.body.as_slice()),
        "the stored response holds the body {body}"
    );
}

#[tokio::test]
async fn gateways_starting_together_create_the_schema_once_without_error() {
    let Some(bouncer) = dsn("IDEMPO_TEST_PGBOUNCER_DSN") else {
        return;
    };
    let schema = Schema::new(&bouncer, "race");
    let mut opening = Vec::new();
    for _ in 0..4 {
        let mut o = idempo_gateway::store::postgres::PostgresOptions::new(bouncer.clone());
        o.schema = Some(schema.name.clone());
        opening.push(tokio::spawn(async move {
            idempo_gateway::store::postgres::PostgresStore::open(
                &o,
                idempo_gateway::store::Clock::System,
            )
            .await
        }));
    }
    for o in opening {
        let store = o.await.unwrap().unwrap();
        store.ping().await.unwrap();
    }
    // create_schema = false on a schema that does not exist: open fails (readiness says why).
    let mut o = idempo_gateway::store::postgres::PostgresOptions::new(bouncer.clone());
    o.schema = Some(format!("{}_absent", schema.name));
    o.create_schema = false;
    let r = idempo_gateway::store::postgres::PostgresStore::open(
        &o,
        idempo_gateway::store::Clock::System,
    )
    .await;
    assert!(r.is_err());
}
