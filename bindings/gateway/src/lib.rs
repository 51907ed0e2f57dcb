//! # idempo-gateway
//!
//! An HTTP/1.1 and HTTP/2 reverse proxy that applies the idempo protocol in front of any upstream
//! service: a Rust host of `idempo-core`. Every protocol decision (admission, fingerprint,
//! scope, the flow, capture, problem responses, the downstream key, defaults, metric names) is
//! core's; this crate does the I/O: sockets, the upstream exchange, the stores, timers.
//!
//! Modules: [`config`] (the TOML file), [`route`] (path templates), [`store`] (memory, SQLite,
//! PostgreSQL, Redis), [`proxy`] (the server, routing, operations endpoints), [`admission`]
//! (core's admission), [`driver`] (core's flow), [`exchange`] (the upstream call and the tee),
//! [`jwt`] (the principal from a verified JWT) and [`reload`] (its JWKS file read again), [`forward`],
//! [`metrics`], [`log`], [`purge`],
//! [`shutdown`], [`body`].
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod body;
pub mod config;
pub mod driver;
pub mod exchange;
pub mod forward;
pub mod jwt;
pub mod log;
pub mod metrics;
pub mod proxy;
pub mod purge;
pub mod reload;
pub mod route;
pub mod shutdown;
pub mod store;

use std::sync::Arc;

use config::{GatewayConfig, StoreConfig};
use store::{Clock, Store, StoreError};

/// Opens the configured store (SQLite on the blocking pool; PostgreSQL creates its schema
/// unless `create_schema = false`; Redis checks the server's `maxmemory-policy`).
///
/// # Errors
/// [`StoreError`] when the store cannot be opened.
pub async fn open_store(cfg: &GatewayConfig) -> Result<Store, StoreError> {
    match &cfg.store {
        StoreConfig::Memory {
            max_entries,
            max_bytes,
        } => Ok(Store::Memory(store::memory::MemStore::new(
            *max_entries,
            *max_bytes,
            Clock::System,
        ))),
        StoreConfig::Sqlite {
            path,
            busy_timeout_ms,
        } => {
            let path = path.clone();
            let busy = *busy_timeout_ms;
            let s = tokio::task::spawn_blocking(move || {
                store::sqlite::SqliteStore::open(&path, busy, Clock::System)
            })
            .await
            .map_err(|e| StoreError::Worker(e.to_string()))??;
            Ok(Store::Sqlite(s))
        }
        StoreConfig::Postgres(options) => Ok(Store::Postgres(
            store::postgres::PostgresStore::open(options, Clock::System).await?,
        )),
        StoreConfig::Redis(options) => Ok(Store::Redis(
            store::redis::RedisStore::open(options, Clock::System).await?,
        )),
    }
}

/// Runs the gateway for `cfg` until `shutdown` resolves: opens the store, binds the operations
/// listener when there is one (logged as `operations listening`) and the listener (its address
/// is logged as `listening`), serves.
///
/// # Errors
/// A message when the store cannot be opened or the address bound.
pub async fn run(
    cfg: GatewayConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let store = open_store(&cfg)
        .await
        .map_err(|e| format!("cannot open the store: {e}"))?;
    let shared = proxy::Shared::new(cfg, store);
    if let Store::Sqlite(s) = &shared.store {
        shared.metrics.attach_sqlite_batches(s.batch_stats());
    }
    // Before the listener: a SIGHUP sent once the gateway says it listens reloads, never kills.
    let reload = reload::start(&shared);
    // A Redis Cluster's primaries are checked again when they change (a failover).
    let topology = match &shared.store {
        Store::Redis(r) => r.watch(),
        _ => None,
    };
    let operations = match shared.cfg.operations_listen {
        None => None,
        Some(at) => {
            let l = tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| format!("cannot listen on {at} (operations_listen): {e}"))?;
            let addr = l
                .local_addr()
                .map_err(|e| format!("no local address: {e}"))?;
            log::info(
                "operations listening",
                &[("addr", serde_json::json!(addr.to_string()))],
            );
            Some(tokio::spawn(proxy::serve_operations(
                Arc::clone(&shared),
                l,
            )))
        }
    };
    let listener = tokio::net::TcpListener::bind(shared.cfg.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", shared.cfg.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("no local address: {e}"))?;
    log::info(
        "listening",
        &[
            ("addr", serde_json::json!(addr.to_string())),
            ("routes", serde_json::json!(shared.cfg.routes.len())),
        ],
    );
    proxy::serve(Arc::clone(&shared), listener, shutdown).await;
    for task in [reload, topology, operations].into_iter().flatten() {
        task.abort();
    }
    log::flush();
    Ok(())
}
