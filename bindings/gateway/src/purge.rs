//! The periodic purge task: core's purge primitive (`SQLITE_PURGE`, the memory store's
//! `purge_expired`) in batches, every `purge_interval_ms`.
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::log;
use crate::proxy::Shared;

/// Batches one round runs at most (the rest waits for the next round).
const MAX_BATCHES_PER_ROUND: u32 = 100;

/// Runs forever (the server aborts it at shutdown).
pub async fn run(shared: Arc<Shared>) {
    let every = Duration::from_millis(shared.cfg.purge_interval_ms);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        ticker.tick().await;
        round(&shared).await;
    }
}

/// One purge round: batches until one deletes fewer than a batch.
pub async fn round(shared: &Shared) -> u64 {
    let batch = shared.cfg.purge_batch;
    let mut total = 0;
    for _ in 0..MAX_BATCHES_PER_ROUND {
        match shared.store.purge_expired(batch).await {
            Ok(c) => {
                total += c.total();
                if c.total() < batch {
                    break;
                }
            }
            Err(e) => {
                log::warn("purge failed", &[("error", json!(e.to_string()))]);
                break;
            }
        }
    }
    if total > 0 {
        log::info("purged expired records", &[("deleted", json!(total))]);
    }
    total
}
